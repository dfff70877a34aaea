// prepack/checkpoint/safetensors.hpp - a reader for safetensors files (Hugging Face's weight
// format): an 8-byte little-endian header length, a JSON header naming every tensor's dtype, shape
// and byte range, then the data. The JSON is parsed with nlohmann-json (a dependency of this header
// and of prepack::checkpoint only, never of the core); every range is checked against the file, and
// tensors are converted to fp32 one at a time (F32, F16, BF16).
// Cost: O(header) to parse; O(elements) to convert a tensor. No copy of the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../numeric.hpp"
#include "../span.hpp"

PREPACK_NAMESPACE_BEGIN
namespace checkpoint {

/// A tensor of a safetensors file: its dtype, shape (outermost first, as torch) and bytes.
struct safetensors_tensor {
  std::string name, dtype;           // "F32", "F16" or "BF16"
  std::vector<std::uint64_t> shape;  // torch order: shape.back() is contiguous
  std::uint64_t offset = 0;          // from the start of the file
  std::uint64_t bytes = 0;
  std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;
    return n;
  }
};

/// A parsed safetensors file over its bytes (which must outlive it).
class safetensors_file {
 public:
  /// Parses `bytes`; `name` names the file in errors. Throws prepack::error naming the file and
  /// the tensor for a truncated file, a header that is not JSON or not of the format, an
  /// unsupported dtype, a shape whose size disagrees with its byte range, or a range past the end
  /// of the file.
  safetensors_file(span<const unsigned char> bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)) {
    parse();
  }

  const std::string& name() const noexcept { return name_; }
  const std::vector<safetensors_tensor>& tensors() const noexcept { return tensors_; }
  const safetensors_tensor* find(const std::string& tensor) const {
    const auto it = index_.find(tensor);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  const std::map<std::string, std::string>& metadata() const noexcept { return meta_; }

  /// Converts a tensor to fp32 into out (its elements in the file's order).
  void read(const safetensors_tensor& t, span<float> out) const {
    prepack::detail::require(out.size() == t.elements(), name_, ": tensor ", t.name, ": ",
                             out.size(), " floats for ", t.elements(), " elements");
    const unsigned char* p = bytes_.data() + t.offset;
    if (t.dtype == "F32") {
      std::memcpy(out.data(), p, out.size() * 4);
      return;
    }
    const bool bf = t.dtype == "BF16";
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto b = static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
      out[i] = bf ? bfloat16::to_float(b) : half::to_float(b);
    }
  }

 private:
  void parse() {
    prepack::detail::require(bytes_.size() >= 8, name_, ": truncated (", bytes_.size(),
                             " bytes, no header length)");
    std::uint64_t n = 0;
    std::memcpy(&n, bytes_.data(), 8);
    prepack::detail::require(n <= bytes_.size() - 8, name_, ": header of ", n,
                             " bytes runs past the end of the file (", bytes_.size(), " bytes)");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(bytes_.data() + 8, bytes_.data() + 8 + n);
    } catch (const nlohmann::json::exception& e) {
      prepack::detail::fail(name_, ": header is not JSON (", e.what(), ")");
    }
    prepack::detail::require(header.is_object(), name_, ": header is not a JSON object");
    try {
      tensors_of(header, 8 + n);
    } catch (const nlohmann::json::exception& e) {  // a value of an unexpected JSON type
      prepack::detail::fail(name_, ": header: ", e.what());
    }
  }

  // The tensor entries of a parsed header whose data section starts at byte `data`.
  void tensors_of(const nlohmann::json& header, std::uint64_t data) {
    for (const auto& [key, entry] : header.items()) {
      if (key == "__metadata__") {
        if (entry.is_object()) {
          for (const auto& [k, v] : entry.items()) {
            if (v.is_string()) meta_[k] = v.get<std::string>();
          }
        }
        continue;
      }
      safetensors_tensor t;
      t.name = key;
      prepack::detail::require(
          entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
              entry.contains("shape") && entry["shape"].is_array() &&
              entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
              entry["data_offsets"].size() == 2,
          name_, ": tensor ", key, ": entry lacks dtype, shape or data_offsets");
      t.dtype = entry["dtype"].get<std::string>();
      std::uint64_t size = 0;
      if (t.dtype == "F32") {
        size = 4;
      } else if (t.dtype == "F16" || t.dtype == "BF16") {
        size = 2;
      } else {
        prepack::detail::fail(name_, ": tensor ", key, ": dtype ", t.dtype,
                              " is not supported (F32, F16, BF16)");
      }
      std::uint64_t elements = 1;
      for (const auto& d : entry["shape"]) {
        prepack::detail::require(
            d.is_number_unsigned() || (d.is_number_integer() && d.get<long long>() >= 0), name_,
            ": tensor ", key, ": shape entry is not a non-negative integer");
        const auto e = d.get<std::uint64_t>();
        prepack::detail::require(e == 0 || elements <= (std::uint64_t{1} << 48) / e, name_,
                                 ": tensor ", key, ": shape too large");
        elements *= e;
        t.shape.push_back(e);
      }
      const auto& off = entry["data_offsets"];
      prepack::detail::require(off[0].is_number_unsigned() && off[1].is_number_unsigned(), name_,
                               ": tensor ", key, ": data_offsets are not non-negative integers");
      const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
      prepack::detail::require(begin <= end && end <= bytes_.size() - data, name_, ": tensor ", key,
                               ": bytes [", begin, ", ", end, ") lie past the end of the file (",
                               bytes_.size() - data, " data bytes)");
      prepack::detail::require(end - begin == elements * size, name_, ": tensor ", key, ": ",
                               end - begin, " bytes for ", elements, " ", t.dtype, " elements");
      t.offset = data + begin;
      t.bytes = end - begin;
      index_[key] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
  }

  span<const unsigned char> bytes_;
  std::string name_;
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> meta_;
};

}  // namespace checkpoint
PREPACK_NAMESPACE_END
