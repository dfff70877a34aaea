// prepack/checkpoint/mapped_file.hpp - a file mapped read-only into memory (POSIX mmap), the
// bytes every checkpoint reader parses: a multi-GiB checkpoint costs page cache, not twice its
// size in RAM. Needs POSIX; no other dependency.
// Cost: O(1) to map; pages are read as they are touched.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../error.hpp"
#include "../span.hpp"

PREPACK_NAMESPACE_BEGIN
namespace checkpoint {

/// A regular file's bytes, mapped read-only for the object's lifetime. Move-only.
class mapped_file {
 public:
  /// Maps `path`. Throws prepack::error naming the file when it cannot be opened, is not a
  /// regular file, or cannot be mapped.
  explicit mapped_file(std::string path) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      prepack::detail::fail(path_, ": cannot open (", std::generic_category().message(errno), ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      prepack::detail::fail(path_, ": not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int map_error = errno;
      ::close(fd);
      if (p == MAP_FAILED) {
        prepack::detail::fail(path_, ": cannot map ", size_, " bytes (",
                              std::generic_category().message(map_error), ")");
      }
      data_ = static_cast<const unsigned char*>(p);
    } else {
      ::close(fd);
    }
  }
  ~mapped_file() { unmap(); }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& o) noexcept
      : path_(std::move(o.path_)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  mapped_file& operator=(mapped_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  span<const unsigned char> bytes() const noexcept { return {data_, size_}; }
  /// Gives back to the kernel the whole pages inside [offset, offset + n) that were read (they
  /// fault in again from the file if read later), so a loader that has copied or converted a
  /// tensor does not keep the file's pages resident beside its own copy. Cost: one madvise.
  void release(std::size_t offset, std::size_t n) const noexcept {
    const long page = ::sysconf(_SC_PAGESIZE);
    if (data_ == nullptr || page <= 0 || offset >= size_) return;
    const auto ps = static_cast<std::size_t>(page);
    const std::size_t end = offset + std::min(n, size_ - offset);
    const std::size_t first = (offset + ps - 1) / ps * ps, last = end / ps * ps;
    if (last > first) {
      ::madvise(const_cast<unsigned char*>(data_) + first, last - first, MADV_DONTNEED);
    }
  }
  const std::string& path() const noexcept { return path_; }

 private:
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
    data_ = nullptr;
  }
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace checkpoint
PREPACK_NAMESPACE_END
