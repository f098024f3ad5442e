#include "net/wire.h"
