// prepack/checkpoint/gguf.hpp - a reader for GGUF (versions 2 and 3), llama.cpp's model format:
// its metadata and its tensor table, parsed from bytes (a mapped_file, or any buffer) with every
// offset, count and size checked, and tensors dequantized to fp32 one at a time
// (checkpoint/quant.hpp: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K,
// IQ4_NL, IQ4_XS).
// Standard library only.
//
// Layout (little-endian): "GGUF", version u32, tensor count u64, metadata count u64; metadata as
// (key string, type u32, value); tensor infos as (name string, n_dims u32, dims u64[n_dims],
// type u32, offset u64); the data section at the next multiple of general.alignment (default
// 32), each tensor at its offset from there. Strings are u64 length + bytes; arrays are element
// type u32, count u64, then the elements. ggml's dimension order: dims[0] is the innermost
// (contiguous) one, so a torch weight [out][in] is stored with dims {in, out}.
// Metadata arrays are not copied when parsed: their place in the file is kept, and strings(),
// numbers() read them on demand (a 128k-entry vocabulary costs nothing until asked for).
// Cost: O(header bytes) to parse; O(elements) to read an array or dequantize a tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../span.hpp"
#include "quant.hpp"

PREPACK_NAMESPACE_BEGIN
namespace checkpoint {

/// GGUF's metadata value types, by the number the file stores (gguf.h, enum gguf_type).
enum class gguf_type : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

/// GGUF's name of a metadata type, or nullptr for a number it does not define.
inline const char* gguf_type_name(gguf_type t) noexcept {
  switch (t) {
    case gguf_type::uint8:
      return "UINT8";
    case gguf_type::int8:
      return "INT8";
    case gguf_type::uint16:
      return "UINT16";
    case gguf_type::int16:
      return "INT16";
    case gguf_type::uint32:
      return "UINT32";
    case gguf_type::int32:
      return "INT32";
    case gguf_type::float32:
      return "FLOAT32";
    case gguf_type::boolean:
      return "BOOL";
    case gguf_type::string:
      return "STRING";
    case gguf_type::array:
      return "ARRAY";
    case gguf_type::uint64:
      return "UINT64";
    case gguf_type::int64:
      return "INT64";
    case gguf_type::float64:
      return "FLOAT64";
  }
  return nullptr;
}

/// One metadata value: a number, a string, or an array (kept in the file: its element type,
/// count and place; gguf_file::strings and numbers read it).
struct gguf_value {
  gguf_type type = gguf_type::uint8;
  long long integer = 0;                    // the integer types and bool
  double real = 0;                          // float32, float64
  std::string text;                         // string
  gguf_type array_type = gguf_type::uint8;  // array: its elements' type
  std::uint64_t array_count = 0;            //        their count
  std::uint64_t array_offset = 0;           //        the first one's byte in the file

  bool is_integer() const noexcept {
    switch (type) {
      case gguf_type::uint8:
      case gguf_type::int8:
      case gguf_type::uint16:
      case gguf_type::int16:
      case gguf_type::uint32:
      case gguf_type::int32:
      case gguf_type::uint64:
      case gguf_type::int64:
      case gguf_type::boolean:
        return true;
      case gguf_type::float32:
      case gguf_type::float64:
      case gguf_type::string:
      case gguf_type::array:
        return false;
    }
    return false;
  }
};

/// A tensor of the file: name, shape in ggml order (dims[0] innermost), type, where its bytes
/// are.
struct gguf_tensor {
  std::string name;
  std::vector<std::uint64_t> dims;  // [n_dims]  ggml order: dims[0] is contiguous
  ggml_type type = ggml_type::f32;
  std::uint64_t offset = 0;  // from the start of the file
  std::uint64_t bytes = 0;
  std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : dims) n *= d;
    return n;
  }
};

/// A parsed GGUF file: metadata and tensor table over the file's bytes (which must outlive it).
class gguf_file {
 public:
  /// Parses `bytes`; `name` names the file in errors. Throws prepack::error naming the file and
  /// the item for a wrong magic or version, a truncated header, a count or size that would
  /// overflow, an unknown value type, a tensor of a type prepack cannot dequantize, a shape
  /// that is not a whole number of blocks, or a tensor whose data lies past the end of the file.
  gguf_file(span<const unsigned char> bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)) {
    parse();
  }

  const std::string& name() const noexcept { return name_; }
  std::uint32_t version() const noexcept { return version_; }
  const std::map<std::string, gguf_value>& metadata() const noexcept { return meta_; }
  const std::vector<gguf_tensor>& tensors() const noexcept { return tensors_; }

  bool has(const std::string& key) const { return meta_.count(key) != 0; }
  /// An integer (or bool) metadata value; throws naming the file and key when missing or of
  /// another type.
  long long integer(const std::string& key) const {
    const gguf_value& v = get(key);
    prepack::detail::require(v.is_integer(), name_, ": metadata ", key, " is not an integer");
    return v.integer;
  }
  /// A number (integer or float) metadata value.
  double real(const std::string& key) const {
    const gguf_value& v = get(key);
    if (v.is_integer()) return static_cast<double>(v.integer);
    prepack::detail::require(v.type == gguf_type::float32 || v.type == gguf_type::float64, name_,
                             ": metadata ", key, " is not a number");
    return v.real;
  }
  const std::string& text(const std::string& key) const {
    const gguf_value& v = get(key);
    prepack::detail::require(v.type == gguf_type::string, name_, ": metadata ", key,
                             " is not a string");
    return v.text;
  }
  /// The elements of a string array, as views into the file's bytes. O(count).
  std::vector<std::string_view> strings(const std::string& key) const {
    const gguf_value& v = array_of(key, gguf_type::string);
    std::vector<std::string_view> out;
    out.reserve(static_cast<std::size_t>(v.array_count));
    std::size_t at = static_cast<std::size_t>(v.array_offset);
    for (std::uint64_t i = 0; i < v.array_count; ++i) {
      std::uint64_t n;  // lengths were checked against the file when it was parsed
      std::memcpy(&n, bytes_.data() + at, 8);
      at += 8;
      out.emplace_back(reinterpret_cast<const char*>(bytes_.data() + at),
                       static_cast<std::size_t>(n));
      at += static_cast<std::size_t>(n);
    }
    return out;
  }
  /// The elements of a numeric (or bool) array converted to T. Throws naming the key for an
  /// array of strings or arrays, or an element T cannot hold. O(count).
  template <class T>
  std::vector<T> numbers(const std::string& key) const {
    static_assert(std::is_arithmetic_v<T>, "numbers<T>: an arithmetic T");
    const gguf_value& v = array_of(key, std::nullopt);
    const int size = scalar_size(v.array_type);
    prepack::detail::require(size > 0, name_, ": metadata ", key, " is an array of ",
                             gguf_type_name(v.array_type), ", not of numbers");
    std::vector<T> out(static_cast<std::size_t>(v.array_count));
    const unsigned char* p = bytes_.data() + v.array_offset;
    for (std::size_t i = 0; i < out.size(); ++i, p += size) {
      const auto fail_range = [&](auto x) {
        prepack::detail::fail(name_, ": metadata ", key, "[", i, "] = ", x, " does not fit ",
                              prepack::detail::type_name<T>());
      };
      switch (v.array_type) {
        case gguf_type::float32:
          out[i] = static_cast<T>(load<float>(p));
          break;
        case gguf_type::float64:
          out[i] = static_cast<T>(load<double>(p));
          break;
        case gguf_type::uint8:
          out[i] = integral<T>(load<std::uint8_t>(p), fail_range);
          break;
        case gguf_type::int8:
          out[i] = integral<T>(load<std::int8_t>(p), fail_range);
          break;
        case gguf_type::uint16:
          out[i] = integral<T>(load<std::uint16_t>(p), fail_range);
          break;
        case gguf_type::int16:
          out[i] = integral<T>(load<std::int16_t>(p), fail_range);
          break;
        case gguf_type::uint32:
          out[i] = integral<T>(load<std::uint32_t>(p), fail_range);
          break;
        case gguf_type::int32:
          out[i] = integral<T>(load<std::int32_t>(p), fail_range);
          break;
        case gguf_type::uint64:
          out[i] = integral<T>(load<std::uint64_t>(p), fail_range);
          break;
        case gguf_type::int64:
          out[i] = integral<T>(load<std::int64_t>(p), fail_range);
          break;
        case gguf_type::boolean:
          out[i] = static_cast<T>(p[0] != 0);
          break;
        case gguf_type::string:
        case gguf_type::array:
          PREPACK_ASSERT(false);  // excluded by scalar_size above
          break;
      }
    }
    return out;
  }
  const gguf_tensor* find(const std::string& tensor) const {
    const auto it = index_.find(tensor);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }

  /// Dequantizes a tensor to fp32 into out (its elements in the file's order). Throws
  /// prepack::error, writing nothing, when out has another size.
  void read(const gguf_tensor& t, span<float> out) const {
    prepack::detail::require(out.size() == t.elements(), name_, ": tensor ", t.name, ": ",
                             out.size(), " floats for ", t.elements(), " elements");
    dequantize(t.type, bytes_.data() + t.offset, out.size(), out.data());
  }

 private:
  template <class T>
  static T load(const unsigned char* p) noexcept {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  template <class T, class V, class F>
  static T integral(V v, F&& fail_range) {
    if constexpr (std::is_integral_v<T>) {
      if (!prepack::detail::fits<T>(v)) fail_range(prepack::detail::printable(v));
    }
    return static_cast<T>(v);
  }

  const gguf_value& get(const std::string& key) const {
    const auto it = meta_.find(key);
    prepack::detail::require(it != meta_.end(), name_, ": metadata ", key, " missing");
    return it->second;
  }
  const gguf_value& array_of(const std::string& key, std::optional<gguf_type> element) const {
    const gguf_value& v = get(key);
    prepack::detail::require(v.type == gguf_type::array, name_, ": metadata ", key,
                             " is not an array");
    if (element) {
      prepack::detail::require(v.array_type == *element, name_, ": metadata ", key,
                               " is an array of ", gguf_type_name(v.array_type), ", not of ",
                               gguf_type_name(*element));
    }
    return v;
  }

  // Bounds-checked little-endian reads from the cursor.
  void need(std::uint64_t n, const char* what) const {
    if (n > bytes_.size() - pos_) {
      prepack::detail::fail(name_, ": truncated ", what, " at byte ", pos_, " (", n,
                            " bytes wanted, ", bytes_.size() - pos_, " left)");
    }
  }
  template <class T>
  T take(const char* what) {
    need(sizeof(T), what);
    const T v = load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const auto n = take<std::uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  gguf_type value_type(const std::string& key, const char* what) {
    const auto raw = take<std::uint32_t>(what);
    const auto t = static_cast<gguf_type>(raw);
    if (gguf_type_name(t) == nullptr) {
      prepack::detail::fail(name_, ": metadata ", key, ": unknown value type ", raw);
    }
    return t;
  }

  // Size in bytes of one scalar of a metadata type, 0 for strings and arrays.
  static int scalar_size(gguf_type type) noexcept {
    switch (type) {
      case gguf_type::uint8:
      case gguf_type::int8:
      case gguf_type::boolean:
        return 1;
      case gguf_type::uint16:
      case gguf_type::int16:
        return 2;
      case gguf_type::uint32:
      case gguf_type::int32:
      case gguf_type::float32:
        return 4;
      case gguf_type::uint64:
      case gguf_type::int64:
      case gguf_type::float64:
        return 8;
      case gguf_type::string:
      case gguf_type::array:
        return 0;
    }
    return 0;
  }

  // Walks past the elements of a metadata array, checking each against the file; arrays of
  // arrays too, up to a nesting depth far beyond any real file's so a hostile one cannot
  // exhaust the stack.
  void skip_array(gguf_type type, std::uint64_t count, const std::string& key, int depth) {
    prepack::detail::require(depth < 16, name_, ": metadata ", key,
                             ": arrays nested more than 16 deep");
    switch (type) {
      case gguf_type::array:  // each element: its own element type and count
        prepack::detail::require(count <= (bytes_.size() - pos_) / 12, name_, ": metadata ", key,
                                 ": array of ", count, " arrays runs past the end of the file");
        for (std::uint64_t i = 0; i < count; ++i) {
          const gguf_type inner = value_type(key, "metadata array type");
          const auto inner_count = take<std::uint64_t>("metadata array count");
          skip_array(inner, inner_count, key, depth + 1);
        }
        return;
      case gguf_type::string:  // each at least its 8-byte length
        prepack::detail::require(count <= (bytes_.size() - pos_) / 8, name_, ": metadata ", key,
                                 ": array of ", count, " strings runs past the end of the file");
        for (std::uint64_t i = 0; i < count; ++i) {
          const auto n = take<std::uint64_t>("metadata string");
          need(n, "metadata string");
          pos_ += static_cast<std::size_t>(n);
        }
        return;
      case gguf_type::uint8:
      case gguf_type::int8:
      case gguf_type::uint16:
      case gguf_type::int16:
      case gguf_type::uint32:
      case gguf_type::int32:
      case gguf_type::float32:
      case gguf_type::boolean:
      case gguf_type::uint64:
      case gguf_type::int64:
      case gguf_type::float64: {
        const auto size = static_cast<std::uint64_t>(scalar_size(type));
        prepack::detail::require(count <= (bytes_.size() - pos_) / size, name_, ": metadata ", key,
                                 ": array of ", count, " runs past the end of the file");
        pos_ += static_cast<std::size_t>(count * size);
        return;
      }
    }
  }

  gguf_value value(gguf_type type, const std::string& key) {
    gguf_value v;
    v.type = type;
    switch (type) {
      case gguf_type::uint8:
        v.integer = take<std::uint8_t>("metadata");
        break;
      case gguf_type::int8:
        v.integer = take<std::int8_t>("metadata");
        break;
      case gguf_type::uint16:
        v.integer = take<std::uint16_t>("metadata");
        break;
      case gguf_type::int16:
        v.integer = take<std::int16_t>("metadata");
        break;
      case gguf_type::uint32:
        v.integer = take<std::uint32_t>("metadata");
        break;
      case gguf_type::int32:
        v.integer = take<std::int32_t>("metadata");
        break;
      case gguf_type::float32:
        v.real = take<float>("metadata");
        break;
      case gguf_type::boolean:
        v.integer = take<std::uint8_t>("metadata") != 0;
        break;
      case gguf_type::string:
        v.text = string("metadata string");
        break;
      case gguf_type::uint64: {
        const auto u = take<std::uint64_t>("metadata");
        prepack::detail::require(
            u <= static_cast<std::uint64_t>(std::numeric_limits<long long>::max()), name_,
            ": metadata ", key, " = ", u, " does not fit int64");
        v.integer = static_cast<long long>(u);
        break;
      }
      case gguf_type::int64:
        v.integer = take<std::int64_t>("metadata");
        break;
      case gguf_type::float64:
        v.real = take<double>("metadata");
        break;
      case gguf_type::array:
        v.array_type = value_type(key, "metadata array type");
        v.array_count = take<std::uint64_t>("metadata array count");
        v.array_offset = pos_;
        skip_array(v.array_type, v.array_count, key, 0);
        break;
    }
    return v;
  }

  void parse() {
    need(4, "magic");
    prepack::detail::require(std::memcmp(bytes_.data(), "GGUF", 4) == 0, name_,
                             ": not a GGUF file (wrong magic)");
    pos_ = 4;
    version_ = take<std::uint32_t>("version");
    prepack::detail::require(version_ == 3 || version_ == 2, name_, ": GGUF version ", version_,
                             " (2 or 3 supported)");
    const auto n_tensors = take<std::uint64_t>("tensor count");
    const auto n_meta = take<std::uint64_t>("metadata count");
    // Every metadata entry takes at least 12 bytes, every tensor info at least 24.
    prepack::detail::require(n_meta <= bytes_.size() / 12, name_, ": metadata count ", n_meta,
                             " is more than the file can hold");
    prepack::detail::require(n_tensors <= bytes_.size() / 24, name_, ": tensor count ", n_tensors,
                             " is more than the file can hold");
    for (std::uint64_t i = 0; i < n_meta; ++i) {
      std::string key = string("metadata key");
      const gguf_type type = value_type(key, "metadata type");
      gguf_value v = value(type, key);
      meta_[std::move(key)] = std::move(v);
    }
    std::uint64_t alignment = 32;
    if (has("general.alignment")) {
      const long long a = integer("general.alignment");
      prepack::detail::require(a > 0 && a <= (1 << 20) && (a & (a - 1)) == 0, name_,
                               ": general.alignment ", a, " is not a power of two");
      alignment = static_cast<std::uint64_t>(a);
    }
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      gguf_tensor t;
      t.name = string("tensor name");
      const auto n_dims = take<std::uint32_t>("tensor dims");
      prepack::detail::require(n_dims >= 1 && n_dims <= 4, name_, ": tensor ", t.name, ": ", n_dims,
                               " dimensions");
      std::uint64_t elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const auto e = take<std::uint64_t>("tensor shape");
        prepack::detail::require(e > 0 && elements <= (std::uint64_t{1} << 48) / e, name_,
                                 ": tensor ", t.name, ": dimension ", d, " = ", e,
                                 " (too large or zero)");
        elements *= e;
        t.dims.push_back(e);
      }
      const auto raw_type = take<std::uint32_t>("tensor type");
      t.type = static_cast<ggml_type>(raw_type);
      t.offset = take<std::uint64_t>("tensor offset");
      const std::optional<ggml_block> block = dequantizable_block(t.type);
      if (!block) {
        const char* type_name = ggml_type_name(t.type);
        prepack::detail::fail(
            name_, ": tensor ", t.name, ": type ", type_name != nullptr ? type_name : "",
            type_name != nullptr ? " (" : "", raw_type, type_name != nullptr ? ")" : "",
            " is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
            "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)");
      }
      prepack::detail::require(t.dims[0] % block->elements == 0, name_, ": tensor ", t.name, ": ",
                               ggml_type_name(t.type), " row of ", t.dims[0],
                               " values is not a whole number of ", block->elements,
                               "-value blocks");
      t.bytes = elements / block->elements * block->bytes;
      prepack::detail::require(index_.count(t.name) == 0, name_, ": tensor ", t.name,
                               " appears twice");
      index_[t.name] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
    const std::uint64_t data = (pos_ + alignment - 1) / alignment * alignment;
    for (gguf_tensor& t : tensors_) {
      prepack::detail::require(t.offset % alignment == 0, name_, ": tensor ", t.name, ": offset ",
                               t.offset, " is not aligned to ", alignment);
      prepack::detail::require(data <= bytes_.size() && t.offset <= bytes_.size() - data &&
                                   t.bytes <= bytes_.size() - data - t.offset,
                               name_, ": tensor ", t.name, ": data at ", t.offset, " + ", t.bytes,
                               " bytes lies past the end of the file (", bytes_.size(), " bytes)");
      t.offset += data;
    }
  }

  span<const unsigned char> bytes_;
  std::string name_;
  std::size_t pos_ = 0;
  std::uint32_t version_ = 0;
  std::map<std::string, gguf_value> meta_;
  std::vector<gguf_tensor> tensors_;
  std::map<std::string, std::size_t> index_;
};

}  // namespace checkpoint
PREPACK_NAMESPACE_END
