// How forward arguments and outputs are split into tensor leaves and rebuilt from them.
//
// The hook layer stores a call's arguments so that their owner can run the forward again
// (recomputation), possibly with other tensors in the leaves' places. ArgTraits<T> is the
// customisation point that says how: `flatten` appends T's tensors to a list, `rebuild` makes a T
// shaped like `like` whose tensors are taken, in the same order, from a cursor.
//
// Supported out of the box: at::Tensor, std::optional<at::Tensor> (an absent one is an undefined
// leaf), std::vector<at::Tensor>, std::tuple / std::pair of supported types, and plain values
// (arithmetic types, enums, std::string, c10::Device, c10::ScalarType, and std::vector /
// std::optional of those), which are copied and carry no leaves.
// For a forward that takes a struct of your own, specialise ArgTraits (example at ArgTraits).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace recompose::hooks {

/// Hands out the replacement leaves one at a time, in flatten order (ArgTraits::rebuild takes
/// one).
class LeafCursor {
 public:
  /// A cursor over `leaves`, which must outlive it.
  explicit LeafCursor(const std::vector<at::Tensor>& leaves) : leaves_(leaves) {}
  /// The next leaf. Throws std::invalid_argument when every leaf was handed out already.
  const at::Tensor& next() {
    if (pos_ >= leaves_.size()) {
      throw std::invalid_argument(
          "recompose: fewer replacement tensors than the stored call has leaves; pass one tensor "
          "per leaf, in "
          "flatten order");
    }
    return leaves_[pos_++];
  }
  /// How many leaves were handed out.
  std::size_t consumed() const { return pos_; }

 private:
  const std::vector<at::Tensor>& leaves_;
  std::size_t pos_ = 0;
};

/// How a T is split into tensor leaves (`flatten` appends them to `out`) and rebuilt from them
/// (`rebuild` makes a T shaped like `like`, its tensors taken from the cursor in the same order).
/// The primary template is left undefined so that an unsupported argument type is a compile error
/// that names the type (see Flattenable below) instead of a silently ignored tensor.
///
/// Example: a forward that takes a struct of your own
/// ```
/// struct Batch { at::Tensor tokens; int64_t pad; };
/// template <>
/// struct recompose::hooks::ArgTraits<Batch> {
///   static void flatten(const Batch& b, std::vector<at::Tensor>& out) { out.push_back(b.tokens); }
///   static Batch rebuild(const Batch& like, recompose::hooks::LeafCursor& c) {
///     return Batch{c.next(), like.pad};
///   }
/// };
/// ```
template <class T, class Enable = void>
struct ArgTraits;

namespace detail {
template <class T>
struct is_plain_value
    : std::bool_constant<std::is_arithmetic_v<T> || std::is_enum_v<T> ||
                         std::is_same_v<T, std::string> || std::is_same_v<T, c10::Device>> {};
template <class T>
struct is_plain_value<std::vector<T>> : is_plain_value<T> {};
template <class T>
struct is_plain_value<std::optional<T>> : is_plain_value<T> {};
template <class T>
inline constexpr bool is_plain_value_v = is_plain_value<T>::value;
}  // namespace detail

/// True when ArgTraits<T> is defined for T.
/// Example: `static_assert(recompose::hooks::Flattenable<std::tuple<at::Tensor, double>>);`
template <class T>
concept Flattenable = requires(const T& v, std::vector<at::Tensor>& out, LeafCursor& c) {
  ArgTraits<T>::flatten(v, out);
  { ArgTraits<T>::rebuild(v, c) } -> std::convertible_to<T>;
};

template <class T>
struct ArgTraits<T, std::enable_if_t<detail::is_plain_value_v<T>>> {
  static void flatten(const T&, std::vector<at::Tensor>&) {}
  static T rebuild(const T& like, LeafCursor&) { return like; }
};

template <>
struct ArgTraits<at::Tensor> {
  static void flatten(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
  static at::Tensor rebuild(const at::Tensor&, LeafCursor& c) { return c.next(); }
};

template <>
struct ArgTraits<std::optional<at::Tensor>> {
  static void flatten(const std::optional<at::Tensor>& t, std::vector<at::Tensor>& out) {
    out.push_back(t.has_value() ? *t : at::Tensor());
  }
  static std::optional<at::Tensor> rebuild(const std::optional<at::Tensor>& like, LeafCursor& c) {
    const at::Tensor& leaf = c.next();
    if (!like.has_value()) return std::nullopt;
    return leaf;
  }
};

template <>
struct ArgTraits<std::vector<at::Tensor>> {
  static void flatten(const std::vector<at::Tensor>& v, std::vector<at::Tensor>& out) {
    out.insert(out.end(), v.begin(), v.end());
  }
  static std::vector<at::Tensor> rebuild(const std::vector<at::Tensor>& like, LeafCursor& c) {
    std::vector<at::Tensor> result;
    result.reserve(like.size());
    for (std::size_t i = 0; i < like.size(); ++i) result.push_back(c.next());
    return result;
  }
};

// An optional of any other supported type with tensors (a KV cache: optional<tuple<Tensor,
// Tensor>>): its leaves when present, none when absent.
template <class T>
struct ArgTraits<std::optional<T>,
                 std::enable_if_t<Flattenable<T> && !detail::is_plain_value_v<T> &&
                                  !std::is_same_v<T, at::Tensor>>> {
  static void flatten(const std::optional<T>& v, std::vector<at::Tensor>& out) {
    if (v.has_value()) ArgTraits<T>::flatten(*v, out);
  }
  static std::optional<T> rebuild(const std::optional<T>& like, LeafCursor& c) {
    if (!like.has_value()) return std::nullopt;
    return ArgTraits<T>::rebuild(*like, c);
  }
};

// A vector of any other supported type with tensors (vector<tuple<Tensor, Tensor>>).
template <class T>
struct ArgTraits<std::vector<T>, std::enable_if_t<Flattenable<T> && !detail::is_plain_value_v<T> &&
                                                  !std::is_same_v<T, at::Tensor>>> {
  static void flatten(const std::vector<T>& v, std::vector<at::Tensor>& out) {
    for (const T& e : v) ArgTraits<T>::flatten(e, out);
  }
  static std::vector<T> rebuild(const std::vector<T>& like, LeafCursor& c) {
    std::vector<T> result;
    result.reserve(like.size());
    for (const T& e : like) result.push_back(ArgTraits<T>::rebuild(e, c));
    return result;
  }
};

template <class... Ts>
struct ArgTraits<std::tuple<Ts...>, std::enable_if_t<(Flattenable<Ts> && ...)>> {
  static void flatten(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
    std::apply([&](const Ts&... e) { (ArgTraits<Ts>::flatten(e, out), ...); }, t);
  }
  static std::tuple<Ts...> rebuild(const std::tuple<Ts...>& like, LeafCursor& c) {
    // Braced initialisation evaluates left to right, so leaves are consumed in flatten order.
    return std::apply(
        [&](const Ts&... e) { return std::tuple<Ts...>{ArgTraits<Ts>::rebuild(e, c)...}; }, like);
  }
};

template <class A, class B>
struct ArgTraits<std::pair<A, B>, std::enable_if_t<Flattenable<A> && Flattenable<B>>> {
  static void flatten(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
    ArgTraits<A>::flatten(p.first, out);
    ArgTraits<B>::flatten(p.second, out);
  }
  static std::pair<A, B> rebuild(const std::pair<A, B>& like, LeafCursor& c) {
    A first = ArgTraits<A>::rebuild(like.first, c);
    B second = ArgTraits<B>::rebuild(like.second, c);
    return {std::move(first), std::move(second)};
  }
};

/// Tensor leaves of a value, in order.
/// Example: `flatten_leaves(std::make_tuple(a, 2.0, std::optional<at::Tensor>{}))` is {a, {}}.
template <Flattenable T>
std::vector<at::Tensor> flatten_leaves(const T& value) {
  std::vector<at::Tensor> out;
  ArgTraits<T>::flatten(value, out);
  return out;
}

/// Tensor leaves of a forward's output, in order; none when its type has no ArgTraits.
/// Example: `output_leaves_of(std::make_pair(a, b))` is {a, b}.
template <class R>
std::vector<at::Tensor> output_leaves_of(const R& out) {
  if constexpr (Flattenable<std::remove_cvref_t<R>>) {
    return flatten_leaves(static_cast<const std::remove_cvref_t<R>&>(out));
  } else {
    return {};
  }
}

}  // namespace recompose::hooks
