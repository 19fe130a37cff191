#include "draw_mask.h"

#include "cache_entry.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <bit>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace recompose::detail {
namespace {

// The element as raw bits: the pack and the unpack compare and write bit patterns, so that what
// the replay writes is bitwise what the draw wrote (+0 and 1, never -0).
template <class T, class Raw>
struct Pattern {
  static_assert(sizeof(T) == sizeof(Raw));
  static Raw of(T v) {
    Raw r;
    std::memcpy(&r, &v, sizeof r);
    return r;
  }
  static inline const Raw zero = of(T(0));
  static inline const Raw one = of(T(1));
};

// Eight elements a byte: their 0/1 flags, one a byte in a word, gathered into the word's top
// byte by one multiplication (flag j lands on bit 56 + j, no carries); the tail one by one.
template <class T, class Raw>
bool pack(const void* data, int64_t n, uint8_t* bits) {
  const Raw zero = Pattern<T, Raw>::zero;
  const Raw one = Pattern<T, Raw>::one;
  const auto* raw = static_cast<const Raw*>(data);
  uint8_t inexact = 0;
  const int64_t full = n / 8;
  int64_t b = 0;
#if defined(__SSE2__)
  if constexpr (sizeof(Raw) == 4) {
    // float, the common case, four lanes at a time (SSE2 is x86-64's baseline): the scalar loop
    // below does not vectorise, and the forward packs every dropout's draw.
    const __m128i zero4 = _mm_set1_epi32(static_cast<int>(zero));
    const __m128i one4 = _mm_set1_epi32(static_cast<int>(one));
    int exact = 0xF;
    for (; b < full; ++b) {
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + 8 * b));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(raw + 8 * b + 4));
      const __m128i lo_one = _mm_cmpeq_epi32(lo, one4);
      const __m128i hi_one = _mm_cmpeq_epi32(hi, one4);
      exact &= _mm_movemask_ps(_mm_castsi128_ps(_mm_or_si128(lo_one, _mm_cmpeq_epi32(lo, zero4))));
      exact &= _mm_movemask_ps(_mm_castsi128_ps(_mm_or_si128(hi_one, _mm_cmpeq_epi32(hi, zero4))));
      bits[b] = static_cast<uint8_t>(_mm_movemask_ps(_mm_castsi128_ps(lo_one)) |
                                     (_mm_movemask_ps(_mm_castsi128_ps(hi_one)) << 4));
    }
    inexact |= static_cast<uint8_t>(exact != 0xF);
  }
#endif
  for (; b < full; ++b) {
    const Raw* r = raw + 8 * b;
    uint8_t flags[8];
    for (int j = 0; j < 8; ++j) {
      inexact |= static_cast<uint8_t>((r[j] != zero) & (r[j] != one));
      flags[j] = static_cast<uint8_t>(r[j] == one);
    }
    uint64_t word;
    std::memcpy(&word, flags, sizeof word);
    if constexpr (std::endian::native != std::endian::little) word = __builtin_bswap64(word);
    bits[b] = static_cast<uint8_t>((word * 0x0102040810204080ULL) >> 56);
  }
  if (full * 8 < n) {
    uint8_t byte = 0;
    for (int64_t i = full * 8; i < n; ++i) {
      inexact |= static_cast<uint8_t>((raw[i] != zero) & (raw[i] != one));
      byte |= static_cast<uint8_t>(raw[i] == one) << (i % 8);
    }
    bits[full] = byte;
  }
  return inexact == 0;
}

// Each byte's eight elements, ready to copy: one table per dtype (8 KiB for float).
template <class T, class Raw>
const std::array<std::array<Raw, 8>, 256>& expansions() {
  static const auto table = [] {
    std::array<std::array<Raw, 8>, 256> t{};
    for (int byte = 0; byte < 256; ++byte) {
      for (int j = 0; j < 8; ++j)
        t[byte][j] = ((byte >> j) & 1) != 0 ? Pattern<T, Raw>::one : Pattern<T, Raw>::zero;
    }
    return t;
  }();
  return table;
}

template <class T, class Raw>
void unpack(const uint8_t* bits, int64_t n, void* data) {
  const auto& table = expansions<T, Raw>();
  auto* raw = static_cast<Raw*>(data);
  const int64_t full = n / 8;
  for (int64_t b = 0; b < full; ++b)
    std::memcpy(raw + 8 * b, table[bits[b]].data(), 8 * sizeof(Raw));
  for (int64_t i = full * 8; i < n; ++i) raw[i] = table[bits[full]][i % 8];
}

// Calls f.template operator()<T, Raw>() for the dtypes a draw is kept for (the floating ones, and
// bool); false for others.
template <class F>
bool with_dtype(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat:
      f.template operator()<float, uint32_t>();
      return true;
    case at::kDouble:
      f.template operator()<double, uint64_t>();
      return true;
    case at::kHalf:
      f.template operator()<c10::Half, uint16_t>();
      return true;
    case at::kBFloat16:
      f.template operator()<c10::BFloat16, uint16_t>();
      return true;
    case at::kBool:  // native_dropout's mask: one byte, 0 or 1
      f.template operator()<bool, uint8_t>();
      return true;
    default:
      return false;
  }
}

bool suitable(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage() &&
         t.is_contiguous() && !t.is_conj() && !t.is_neg() && t.numel() > 0 &&
         t.const_data_ptr() != nullptr;
}

}  // namespace

std::unique_ptr<DrawMask> DrawMask::capture(const at::Tensor& drawn) {
  if (!suitable(drawn)) return nullptr;
  std::unique_ptr<DrawMask> mask(new DrawMask());
  mask->dtype_ = drawn.scalar_type();
  mask->numel_ = drawn.numel();
  mask->bits_.resize(static_cast<std::size_t>((mask->numel_ + 7) / 8));
  bool exact = false;
  const bool known = with_dtype(mask->dtype_, [&]<class T, class Raw>() {
    exact = pack<T, Raw>(drawn.const_data_ptr(), mask->numel_, mask->bits_.data());
  });
  if (!known || !exact) return nullptr;
  const auto bytes = static_cast<int64_t>(mask->bits_.size());
  count_bytes_kept(bytes);
  mask->charge_ = MeterCharge(bytes);
  return mask;
}

bool DrawMask::write_into(const at::Tensor& target) const {
  if (!suitable(target) || target.scalar_type() != dtype_ || target.numel() != numel_) return false;
  return with_dtype(dtype_, [&]<class T, class Raw>() {
    unpack<T, Raw>(bits_.data(), numel_, target.data_ptr());
  });
}

DrawMask::~DrawMask() { count_bytes_kept(-static_cast<int64_t>(bits_.size())); }

}  // namespace recompose::detail
