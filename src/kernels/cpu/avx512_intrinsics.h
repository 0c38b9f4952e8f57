// <immintrin.h> for the AVX-512 files. GCC 12's AVX-512 intrinsics initialise their "undefined" pass-through
// operands from themselves, which its own -Wuninitialized then reports at every use (GCC bug 105593). The
// header is fine; the warning is silenced for it only. This header includes nothing else, so the ISA files'
// ODR rule (kernels_avx512.cpp) counts it as <immintrin.h>.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
