/* fastflip's word rule and word access, written once for every C dialect.
 *
 * Included by the Cython kernels (ext/_kernels.pyx, `cdef extern from "ff_word.h"`), by the CUDA C
 * kernels (fastflip.kernels.gpu_kernels.CUDA_SOURCE is this file followed by the kernels, compiled by NVRTC)
 * and by the host C build of those same kernels (fastflip.kernels.gpu_kernels.build_host_library, -DFF_HOST),
 * which the tests check against the NumPy oracle fastflip.core.reference.
 *
 *   new = ((old & and) | or) ^ xor, truncated to the word's width (size bytes)
 *
 * Words are read and written byte by byte in the stored byte order, so unaligned sites and either byte
 * order need no special case. `swap` is fastflip's one byte-order flag: true when the stored order differs
 * from the host's (the host that reads the words back; CUDA devices and their hosts are little-endian).
 */
#ifndef FF_WORD_H
#define FF_WORD_H

typedef unsigned long long ff_u64;
typedef long long ff_i64;

#if !defined(FF_HOST) && (defined(__CUDACC__) || defined(__CUDACC_RTC__))
#define FF_DEVICE __device__ __forceinline__
#define FF_NATIVE_LITTLE 1
#define FF_GLOBAL extern "C" __global__
#define FF_SITES(i, n) \
    for (ff_i64 i = (ff_i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (ff_i64)blockDim.x * gridDim.x)
#else
#define FF_DEVICE static inline
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define FF_NATIVE_LITTLE 0
#else
#define FF_NATIVE_LITTLE 1
#endif
#define FF_GLOBAL
#define FF_SITES(i, n) for (ff_i64 i = 0; i < (n); ++i)
#endif

/* all ones in the low `size` bytes */
FF_DEVICE ff_u64 ff_width(int size) {
    return size >= 8 ? ~0ULL : ((1ULL << (8 * size)) - 1ULL);
}

/* the word rule: the one definition for C, Cython and CUDA */
FF_DEVICE ff_u64 ff_rule(ff_u64 old, ff_u64 a, ff_u64 o, ff_u64 x, int size) {
    return (((old & a) | o) ^ x) & ff_width(size);
}

/* word of `size` bytes at p; `swap`: stored in the other byte order than the host's */
FF_DEVICE ff_u64 ff_load(const unsigned char* p, int size, int swap) {
    int little = FF_NATIVE_LITTLE ^ (swap != 0);
    ff_u64 w = 0;
    for (int j = 0; j < size; ++j) w |= ((ff_u64)p[j]) << (8 * (little ? j : size - 1 - j));
    return w;
}

FF_DEVICE void ff_store(unsigned char* p, int size, int swap, ff_u64 w) {
    int little = FF_NATIVE_LITTLE ^ (swap != 0);
    for (int j = 0; j < size; ++j) p[j] = (unsigned char)(w >> (8 * (little ? j : size - 1 - j)));
}

#endif /* FF_WORD_H */
