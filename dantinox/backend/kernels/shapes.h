// Operand shapes checked before a kernel reads a byte: a wrong shape is a one-line error, not a read out of
// bounds. Each handler states the shapes it reads with the letters of its comment ("q [B, K, G, H]") and
// compares every operand, its result included, against them.

#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace dantinox {

// "[2, 3, 4]"
template <typename Dims>
std::string shape_text(const Dims& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// Whether `dims` is exactly `want`, rank included.
template <typename Dims>
bool has_shape(const Dims& dims, std::initializer_list<int64_t> want) {
  if (dims.size() != want.size()) return false;
  size_t i = 0;
  for (int64_t w : want)
    if (dims[i++] != w) return false;
  return true;
}

// The one-line error: "<what>: expected <expected>; got name [..], name [..]".
template <typename Dims>
xla::ffi::Error shape_error(const char* what, const char* expected,
                            std::initializer_list<std::pair<const char*, Dims>> got) {
  std::string text = std::string(what) + ": expected " + expected + "; got";
  const char* sep = " ";
  for (const auto& [name, dims] : got) {
    text += sep + std::string(name) + " " + shape_text(dims);
    sep = ", ";
  }
  return xla::ffi::Error(xla::ffi::ErrorCode::kInvalidArgument, text);
}

}  // namespace dantinox
