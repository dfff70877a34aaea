// prepack/gguf.hpp - a reader for GGUF (version 3), llama.cpp's model format: its metadata and
// its tensor table, parsed from bytes (a memory-mapped file, or any buffer) with every offset,
// count and size checked, and tensors converted to fp32 one at a time (F32, F16, BF16, Q8_0).
// Standard library only (POSIX mmap for files); the reference model's loader builds on it.
//
// Layout (little-endian): "GGUF", version u32, tensor count u64, metadata count u64; metadata as
// (key string, type u32, value); tensor infos as (name string, n_dims u32, dims u64[n_dims],
// type u32, offset u64); the data section at the next multiple of general.alignment (default
// 32), each tensor at its offset from there. Strings are u64 length + bytes. ggml's dimension
// order: dims[0] is the innermost (contiguous) one, so a torch weight [out][in] is stored with
// dims {in, out}.
// Cost: O(header bytes) to parse; O(elements) to convert a tensor. No copy of the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "detail/checked.hpp"
#include "error.hpp"
#include "numeric.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// A file mapped read-only into memory (POSIX mmap): its bytes without reading them all, so a
/// multi-GiB checkpoint costs page cache, not twice its size in RAM. Throws prepack::error
/// naming the file when it cannot be opened or mapped.
class mapped_file {
 public:
  explicit mapped_file(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    detail::require(fd >= 0, path, ": cannot open");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      detail::fail(path, ": not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      detail::require(p != MAP_FAILED, path, ": cannot map ", size_, " bytes");
      data_ = static_cast<const unsigned char*>(p);
    } else {
      ::close(fd);
    }
  }
  ~mapped_file() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  span<const unsigned char> bytes() const noexcept { return {data_, size_}; }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

/// ggml's tensor types that prepack converts (others are refused by name and number).
enum class ggml_type : std::uint32_t { f32 = 0, f16 = 1, q8_0 = 8, bf16 = 30 };

inline const char* ggml_type_name(std::uint32_t t) {
  switch (t) {
    case 0:
      return "F32";
    case 1:
      return "F16";
    case 8:
      return "Q8_0";
    case 30:
      return "BF16";
    default:
      return "unsupported";
  }
}

/// One metadata value: a number, a string, or an array of them (arrays of strings, such as a
/// tokenizer's vocabulary, are kept as their count only).
struct gguf_value {
  enum class kind { integer, real, boolean, string, array };
  kind type = kind::integer;
  long long integer = 0;
  double real = 0;
  std::string text;
  std::uint64_t array_count = 0;
  std::uint32_t array_type = 0;
};

/// A tensor of the file: name, shape in ggml order (dims[0] innermost), type, where its bytes
/// are.
struct gguf_tensor {
  std::string name;
  std::vector<std::uint64_t> dims;  // [n_dims]  ggml order: dims[0] is contiguous
  std::uint32_t type = 0;
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
  /// overflow, an unknown value type, a tensor of an unsupported type, a shape that is not a
  /// whole number of blocks, or a tensor whose data lies past the end of the file.
  gguf_file(span<const unsigned char> bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)) {
    parse();
  }

  const std::string& name() const noexcept { return name_; }
  std::uint32_t version() const noexcept { return version_; }
  const std::map<std::string, gguf_value>& metadata() const noexcept { return meta_; }
  const std::vector<gguf_tensor>& tensors() const noexcept { return tensors_; }

  bool has(const std::string& key) const { return meta_.count(key) != 0; }
  /// An integer metadata value; throws naming the file and key when missing or not an integer.
  long long integer(const std::string& key) const {
    const gguf_value& v = get(key);
    detail::require(v.type == gguf_value::kind::integer || v.type == gguf_value::kind::boolean,
                    name_, ": metadata ", key, " is not an integer");
    return v.integer;
  }
  double real(const std::string& key) const {
    const gguf_value& v = get(key);
    if (v.type == gguf_value::kind::integer) return static_cast<double>(v.integer);
    detail::require(v.type == gguf_value::kind::real, name_, ": metadata ", key,
                    " is not a number");
    return v.real;
  }
  const std::string& text(const std::string& key) const {
    const gguf_value& v = get(key);
    detail::require(v.type == gguf_value::kind::string, name_, ": metadata ", key,
                    " is not a string");
    return v.text;
  }
  const gguf_tensor* find(const std::string& tensor) const {
    const auto it = index_.find(tensor);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }

  /// Converts a tensor to fp32 into out (its elements in the file's order). Throws
  /// prepack::error when out has another size.
  void read(const gguf_tensor& t, span<float> out) const {
    detail::require(out.size() == t.elements(), name_, ": tensor ", t.name, ": ", out.size(),
                    " floats for ", t.elements(), " elements");
    const unsigned char* p = bytes_.data() + t.offset;
    const std::size_t n = out.size();
    switch (t.type) {
      case 0:
        std::memcpy(out.data(), p, n * 4);
        break;
      case 1:
        for (std::size_t i = 0; i < n; ++i) out[i] = half::to_float(u16(p + 2 * i));
        break;
      case 30:
        for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16::to_float(u16(p + 2 * i));
        break;
      default: {  // Q8_0: blocks of 32 values: an fp16 scale, then 32 int8
        for (std::size_t b = 0; b < n / 32; ++b) {
          const unsigned char* blk = p + 34 * b;
          const float d = half::to_float(u16(blk));
          for (std::size_t k = 0; k < 32; ++k) {
            out[32 * b + k] = d * static_cast<float>(static_cast<std::int8_t>(blk[2 + k]));
          }
        }
      }
    }
  }

 private:
  static std::uint16_t u16(const unsigned char* p) {
    return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
  }

  const gguf_value& get(const std::string& key) const {
    const auto it = meta_.find(key);
    detail::require(it != meta_.end(), name_, ": metadata ", key, " missing");
    return it->second;
  }

  // Bounds-checked little-endian reads from the cursor.
  void need(std::uint64_t n, const char* what) const {
    detail::require(n <= bytes_.size() - pos_, name_, ": truncated ", what, " at byte ", pos_, " (",
                    n, " bytes wanted, ", bytes_.size() - pos_, " left)");
  }
  template <class T>
  T take(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
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

  // Size in bytes of one scalar of a metadata type, 0 for strings, -1 for unknown types.
  static int scalar_size(std::uint32_t type) {
    switch (type) {
      case 0:
      case 1:
      case 7:
        return 1;
      case 2:
      case 3:
        return 2;
      case 4:
      case 5:
      case 6:
        return 4;
      case 10:
      case 11:
      case 12:
        return 8;
      case 8:
        return 0;
      default:
        return -1;
    }
  }

  // Skips the elements of a metadata array (none of them is needed), arrays of arrays too, up
  // to a nesting depth far beyond any real file's so a hostile one cannot exhaust the stack.
  void skip_array(std::uint32_t type, std::uint64_t count, const std::string& key, int depth) {
    detail::require(depth < 16, name_, ": metadata ", key, ": arrays nested more than 16 deep");
    if (type == 9) {  // each element: its own element type and count
      detail::require(count <= (bytes_.size() - pos_) / 12, name_, ": metadata ", key,
                      ": array of ", count, " arrays runs past the end of the file");
      for (std::uint64_t i = 0; i < count; ++i) {
        const auto inner_type = take<std::uint32_t>("metadata array type");
        const auto inner_count = take<std::uint64_t>("metadata array count");
        skip_array(inner_type, inner_count, key, depth + 1);
      }
      return;
    }
    const int size = scalar_size(type);
    detail::require(size >= 0, name_, ": metadata ", key, ": unknown array type ", type);
    if (size > 0) {  // a block of scalars
      detail::require(count <= (bytes_.size() - pos_) / static_cast<std::uint64_t>(size), name_,
                      ": metadata ", key, ": array of ", count, " runs past the end of the file");
      pos_ += static_cast<std::size_t>(count) * static_cast<std::size_t>(size);
    } else {  // strings: each at least its 8-byte length
      detail::require(count <= (bytes_.size() - pos_) / 8, name_, ": metadata ", key, ": array of ",
                      count, " strings runs past the end of the file");
      for (std::uint64_t i = 0; i < count; ++i) {
        const auto n = take<std::uint64_t>("metadata string");
        need(n, "metadata string");
        pos_ += static_cast<std::size_t>(n);
      }
    }
  }

  gguf_value value(std::uint32_t type, const std::string& key) {
    gguf_value v;
    switch (type) {
      case 0:
        v.integer = take<std::uint8_t>("metadata");
        break;
      case 1:
        v.integer = take<std::int8_t>("metadata");
        break;
      case 2:
        v.integer = take<std::uint16_t>("metadata");
        break;
      case 3:
        v.integer = take<std::int16_t>("metadata");
        break;
      case 4:
        v.integer = take<std::uint32_t>("metadata");
        break;
      case 5:
        v.integer = take<std::int32_t>("metadata");
        break;
      case 6:
        v.type = gguf_value::kind::real;
        v.real = take<float>("metadata");
        break;
      case 7:
        v.type = gguf_value::kind::boolean;
        v.integer = take<std::uint8_t>("metadata") != 0;
        break;
      case 8:
        v.type = gguf_value::kind::string;
        v.text = string("metadata string");
        break;
      case 10: {
        const auto u = take<std::uint64_t>("metadata");
        detail::require(u <= static_cast<std::uint64_t>(std::numeric_limits<long long>::max()),
                        name_, ": metadata ", key, " = ", u, " does not fit int64");
        v.integer = static_cast<long long>(u);
        break;
      }
      case 11:
        v.integer = take<std::int64_t>("metadata");
        break;
      case 12:
        v.type = gguf_value::kind::real;
        v.real = take<double>("metadata");
        break;
      case 9:
        v.type = gguf_value::kind::array;
        v.array_type = take<std::uint32_t>("metadata array type");
        v.array_count = take<std::uint64_t>("metadata array count");
        skip_array(v.array_type, v.array_count, key, 0);
        break;
      default:
        detail::fail(name_, ": metadata ", key, ": unknown value type ", type);
    }
    return v;
  }

  void parse() {
    need(4, "magic");
    detail::require(std::memcmp(bytes_.data(), "GGUF", 4) == 0, name_,
                    ": not a GGUF file (wrong magic)");
    pos_ = 4;
    version_ = take<std::uint32_t>("version");
    detail::require(version_ == 3 || version_ == 2, name_, ": GGUF version ", version_,
                    " (2 or 3 supported)");
    const auto n_tensors = take<std::uint64_t>("tensor count");
    const auto n_meta = take<std::uint64_t>("metadata count");
    // Every metadata entry takes at least 12 bytes, every tensor info at least 24.
    detail::require(n_meta <= bytes_.size() / 12, name_, ": metadata count ", n_meta,
                    " is more than the file can hold");
    detail::require(n_tensors <= bytes_.size() / 24, name_, ": tensor count ", n_tensors,
                    " is more than the file can hold");
    for (std::uint64_t i = 0; i < n_meta; ++i) {
      std::string key = string("metadata key");
      const auto type = take<std::uint32_t>("metadata type");
      gguf_value v = value(type, key);
      meta_[std::move(key)] = std::move(v);
    }
    std::uint64_t alignment = 32;
    if (has("general.alignment")) {
      const long long a = integer("general.alignment");
      detail::require(a > 0 && a <= (1 << 20) && (a & (a - 1)) == 0, name_, ": general.alignment ",
                      a, " is not a power of two");
      alignment = static_cast<std::uint64_t>(a);
    }
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      gguf_tensor t;
      t.name = string("tensor name");
      const auto n_dims = take<std::uint32_t>("tensor dims");
      detail::require(n_dims >= 1 && n_dims <= 4, name_, ": tensor ", t.name, ": ", n_dims,
                      " dimensions");
      std::uint64_t elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const auto e = take<std::uint64_t>("tensor shape");
        detail::require(e > 0 && elements <= (std::uint64_t{1} << 48) / e, name_, ": tensor ",
                        t.name, ": dimension ", d, " = ", e, " (too large or zero)");
        elements *= e;
        t.dims.push_back(e);
      }
      t.type = take<std::uint32_t>("tensor type");
      t.offset = take<std::uint64_t>("tensor offset");
      switch (t.type) {
        case 0:
          t.bytes = elements * 4;
          break;
        case 1:
        case 30:
          t.bytes = elements * 2;
          break;
        case 8:
          detail::require(t.dims[0] % 32 == 0, name_, ": tensor ", t.name, ": Q8_0 row of ",
                          t.dims[0], " values is not a whole number of 32-value blocks");
          t.bytes = elements / 32 * 34;
          break;
        default:
          detail::fail(name_, ": tensor ", t.name, ": type ", t.type,
                       " is not supported (F32, F16, BF16, Q8_0)");
      }
      detail::require(index_.count(t.name) == 0, name_, ": tensor ", t.name, " appears twice");
      index_[t.name] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
    const std::uint64_t data = (pos_ + alignment - 1) / alignment * alignment;
    for (gguf_tensor& t : tensors_) {
      detail::require(t.offset % alignment == 0, name_, ": tensor ", t.name, ": offset ", t.offset,
                      " is not aligned to ", alignment);
      detail::require(data <= bytes_.size() && t.offset <= bytes_.size() - data &&
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

PREPACK_NAMESPACE_END
