#include "net/control.h"
