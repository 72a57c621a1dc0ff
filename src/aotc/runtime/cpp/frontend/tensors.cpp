// aotc::load_tensors / save_tensors (include/aotc/module.h): safetensors files outside an
// artifact, read with the weights' header checks.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "../instr.h"
#include "aotc/module.h"
#include "native.h"

namespace aotc {

namespace {

const std::pair<const char*, at::ScalarType> kCodes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong}, {"I32", at::kInt}, {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte}, {"BOOL", at::kBool}};

std::string code_of(at::ScalarType t, const std::string& path) {
  for (const auto& [c, dt] : kCodes)
    if (dt == t) return c;
  throw UsageError("cannot write a " + dtype_name(t) + " tensor", path,
                   "float64, float32, float16, bfloat16, integer or bool tensors", dtype_name(t),
                   "convert the tensor first");
}

}  // namespace

std::vector<at::Tensor> load_tensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot read " + path, path, "a safetensors file", std::strerror(errno),
                           "check the path");
  auto bytes = std::make_shared<fe::Bytes>();
  bytes->heap.assign(std::istreambuf_iterator<char>(f), {});
  bytes->data = reinterpret_cast<const uint8_t*>(bytes->heap.data());
  bytes->size = bytes->heap.size();
  auto header = fe::safetensors_header(*bytes, path);
  std::vector<at::Tensor> out;
  for (size_t i = 0; header.count(std::to_string(i)); ++i)
    out.push_back(fe::stored_tensor(bytes, header.at(std::to_string(i))).clone());
  return out;
}

void save_tensors(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::string header = "{";
  std::vector<at::Tensor> dense;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    dense.push_back(tensors[i].contiguous().cpu());
    const at::Tensor& t = dense.back();
    std::string shape;
    for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? "," : "") + std::to_string(t.size(d));
    uint64_t n = t.numel() * t.element_size();
    header += std::string(i ? "," : "") + "\"" + std::to_string(i) + "\":{\"dtype\":\"" +
              code_of(t.scalar_type(), path) + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + n) + "]}";
    offset += n;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t len = header.size();
  char le[8];
  for (int k = 0; k < 8; ++k) le[k] = char(len >> (8 * k));
  f.write(le, 8).write(header.data(), std::streamsize(len));
  for (const auto& t : dense) f.write(static_cast<const char*>(t.data_ptr()), std::streamsize(t.numel() * t.element_size()));
  if (!f) throw UsageError("cannot write " + path, path, "a writable path", std::strerror(errno), "check the path");
}

}  // namespace aotc
