#include "net/ucx.h"
