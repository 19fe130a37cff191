#pragma once
#include "gloo/context.h"
