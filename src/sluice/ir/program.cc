#include "sluice/ir/program.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cstdint>
#include <functional>
#include <span>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

std::string TensorType::ToString() const {
  return fmt::format("{}{}", Name(dtype), shape.ToString());
}

size_t TensorTypeHash::operator()(const TensorType& t) const {
  size_t h =
      static_cast<size_t>(t.dtype) * 0x9E3779B97F4A7C15ull + static_cast<size_t>(t.shape.rank());
  for (int64_t d : t.shape.dims()) h = (h ^ static_cast<size_t>(d)) * 0x100000001B3ull;
  return h;
}

TypeId Program::InternType(const TensorType& type) {
  auto [it, added] = type_ids_.try_emplace(type, static_cast<TypeId>(types_.size()));
  if (added) types_.push_back(type);
  return it->second;
}

namespace {

uint32_t HashName(std::string_view name) {
  return static_cast<uint32_t>(std::hash<std::string_view>{}(name));
}

// Whether FreshName can make `name`: "<hint>_<decimal counter>".
bool LooksFresh(std::string_view name) {
  const size_t underscore = name.find_last_of('_');
  if (underscore == std::string_view::npos || underscore + 1 == name.size()) return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(underscore) + 1, name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

// Asks the kernel to back the (untouched) memory [data, data + bytes) with huge pages where it can
// (Linux: MADV_HUGEPAGE; transparent huge pages are often 'madvise' only). A large index is probed
// at random, once per name looked up: with 4 KiB pages nearly every probe also misses the TLB.
void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr size_t kPage = 4096;
  if (bytes < (size_t{4} << 20)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kPage - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// Open addressing with linear probing over ids whose names `name_of(id)` gives: the slot holding
// `name`, or the free slot ending its probe sequence.
template <typename Slot, typename NameOf>
size_t Probe(const std::vector<Slot>& index, std::string_view name, uint32_t hash, NameOf name_of) {
  const size_t mask = index.size() - 1;
  size_t slot = hash & mask;
  for (;; slot = (slot + 1) & mask) {
    const Slot& s = index[slot];
    if (s.id == kNoValue || (s.hash == hash && name_of(s.id) == name)) return slot;
  }
}

// Grows `index` (rehashing) to the smallest power of two, at least 16, that holds `names` at most
// half full. Doubling at half load keeps the load between 1/4 and 1/2.
template <typename Slot>
void Reserve(std::vector<Slot>& index, size_t names) {
  if (2 * names <= index.size()) return;
  size_t size = 16;
  while (size < 2 * names) size *= 2;
  std::vector<Slot> old = std::move(index);
  index = {};
  index.reserve(size);
  AdviseHugePages(index.data(), size * sizeof(Slot));
  index.assign(size, Slot{});
  const size_t mask = size - 1;
  for (const Slot& entry : old) {  // names are distinct: the first free slot is its place
    if (entry.id == kNoValue) continue;
    size_t slot = entry.hash & mask;
    while (index[slot].id != kNoValue) slot = (slot + 1) & mask;
    index[slot] = entry;
  }
}

size_t Program::FindSlot(std::string_view name, uint32_t hash) const {
  return Probe(index_, name, hash,
               [&](ValueId id) -> std::string_view { return values_[id].name; });
}

void Program::IndexReserve(size_t values) { Reserve(index_, values); }

// Backward-shift deletion: the entries after the freed slot move up into it when their probe
// sequence passes it, so that no search stops early.
void Program::IndexErase(ValueId id) {
  const size_t mask = index_.size() - 1;
  size_t hole = FindSlot(values_[id].name, HashName(values_[id].name));
  SLUICE_CHECK(index_[hole].id == id);
  for (size_t s = (hole + 1) & mask; index_[s].id != kNoValue; s = (s + 1) & mask) {
    const size_t home = index_[s].hash & mask;
    if (((s - home) & mask) >= ((s - hole) & mask)) {
      index_[hole] = index_[s];
      hole = s;
    }
  }
  index_[hole] = {};
}

std::optional<ValueId> Program::Find(std::string_view name) const {
  if (index_.empty()) return std::nullopt;
  const ValueId id = index_[FindSlot(name, HashName(name))].id;
  if (id == kNoValue) return std::nullopt;
  return id;
}

ValueId Program::Get(std::string_view name) const {
  std::optional<ValueId> id = Find(name);
  if (!id) throw ProgramError(fmt::format("program '{}' has no value %{}", name_, name));
  return *id;
}

ValueId Program::NewValue(std::string name, TypeId type, ValueKind kind, int32_t producer) {
  if (name.empty()) throw ProgramError(fmt::format("program '{}': a value needs a name", name_));
  IndexReserve(values_.size() + 1);
  const uint32_t hash = HashName(name);
  const size_t slot = FindSlot(name, hash);
  if (index_[slot].id != kNoValue) {
    throw ProgramError(fmt::format("program '{}': value %{} is defined twice", name_, name));
  }
  ValueId id = static_cast<ValueId>(values_.size());
  values_.push_back({std::move(name), type, kind, producer});
  index_[slot] = {id, hash};
  verified_ = false;
  return id;
}

ValueId Program::AddInput(std::string name, TensorType type) {
  ValueId id = NewValue(std::move(name), InternType(type), ValueKind::kInput, -1);
  inputs_.push_back(id);
  return id;
}

ValueId Program::AddParam(std::string name, TensorType type) {
  ValueId id = NewValue(std::move(name), InternType(type), ValueKind::kParam, -1);
  params_.push_back(id);
  return id;
}

ValueId Program::AddConst(std::string name, TensorType type) {
  const ValueId id = AddParam(std::move(name), std::move(type));
  if (is_constant_.size() <= static_cast<size_t>(id)) is_constant_.resize(values_.size(), false);
  is_constant_[static_cast<size_t>(id)] = true;
  return id;
}

ValueId Program::AddBuffer(std::string name, TensorType type) {
  const ValueId id = AddConst(std::move(name), std::move(type));
  if (is_buffer_.size() <= static_cast<size_t>(id)) is_buffer_.resize(values_.size(), false);
  is_buffer_[static_cast<size_t>(id)] = true;
  return id;
}

ValueId Program::AddParamLike(const Program& source, ValueId v) {
  if (source.IsBuffer(v)) return AddBuffer(source.value(v).name, source.type(v));
  return source.IsConstant(v) ? AddConst(source.value(v).name, source.type(v))
                              : AddParam(source.value(v).name, source.type(v));
}

std::string InPlaceInputProblem(const Program& p, const OpDef& op, int k, ValueId v) {
  if (op.kind != OpKind::kInPlace || !p.IsConstant(v)) return {};
  const bool written = std::find(op.updates.begin(), op.updates.end(), k) != op.updates.end();
  const std::string& name = p.value(v).name;
  if (op.updates_buffers) {
    if (!written || p.IsBuffer(v)) return {};
    return fmt::format(
        "%{} is a constant, and {} updates it in place (running statistics are kept in "
        "buffers: declare it `buffer %{}: ...`)",
        name, op.name, name);
  }
  if (p.IsBuffer(v)) {
    return fmt::format(
        "%{} is a buffer, and {} updates its inputs in place (only the ops that keep running "
        "statistics, such as batch_norm_update_stats, touch buffers)",
        name, op.name);
  }
  return fmt::format(
      "%{} is a constant, and {} updates its inputs in place (constants never "
      "change)",
      name, op.name);
}

ValueList Program::AddInstruction(std::string_view op_name, ValueList inputs, Attrs attrs,
                                  std::vector<std::string> output_names) {
  const OpDef& op = OpRegistry::Global().Get(op_name);
  auto where = [&]() {
    return output_names.empty() ? fmt::format("{} (instruction {})", op.name, instructions_.size())
                                : fmt::format("{} %{}", op.name, output_names[0]);
  };
  if (op.num_inputs >= 0 && static_cast<int>(inputs.size()) != op.num_inputs) {
    throw ProgramError(
        fmt::format("{}: takes {} inputs, got {}", where(), op.num_inputs, inputs.size()));
  }
  if (op.num_inputs < 0 && inputs.empty()) {
    throw ProgramError(fmt::format("{}: takes at least one input", where()));
  }
  if (std::string undeclared = UndeclaredAttrsMessage(op, attrs); !undeclared.empty()) {
    throw ProgramError(fmt::format("{}: {}", where(), undeclared));
  }
  // The input types, on the stack for the usual few inputs.
  constexpr size_t kInline = 6;
  std::array<TensorType, kInline> inline_types;
  std::vector<TensorType> heap_types;
  if (inputs.size() > kInline) heap_types.resize(inputs.size());
  const std::span<TensorType> in_types = inputs.size() > kInline
                                             ? std::span<TensorType>(heap_types)
                                             : std::span(inline_types).first(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ValueId v = inputs[k];
    if (v < 0 || static_cast<size_t>(v) >= values_.size()) {
      throw ProgramError(fmt::format("{}: input refers to an undefined value", where()));
    }
    if (std::string problem = InPlaceInputProblem(*this, op, static_cast<int>(k), v);
        !problem.empty()) {
      throw ProgramError(fmt::format("{}: {}", where(), problem));
    }
    in_types[k] = types_[values_[v].type_id];
  }
  std::vector<TensorType> out_types;
  try {
    out_types = op.infer(in_types, attrs);
  } catch (const ShapeError& e) {
    std::vector<std::string> names;
    for (ValueId v : inputs)
      names.push_back(fmt::format("%{}: {}", values_[v].name, type(v).ToString()));
    throw ShapeError(fmt::format("{}({}): {}", where(), fmt::join(names, ", "), e.what()));
  } catch (const ProgramError& e) {
    throw ProgramError(fmt::format("{}: {}", where(), e.what()));
  }
  if (!output_names.empty() && output_names.size() != out_types.size()) {
    throw ProgramError(fmt::format("{}: produces {} outputs but {} names were given", where(),
                                   out_types.size(), output_names.size()));
  }
  // Check every name before defining any, so a failed instruction leaves the program unchanged.
  // One index probe per name: the slot found stays valid for the first output (the index is grown
  // for all of them first); later outputs probe again, since an earlier one may have taken it.
  const size_t n = out_types.size();
  IndexReserve(values_.size() + n);
  std::vector<uint32_t> hashes(output_names.size());
  size_t first_slot = 0;
  if (!output_names.empty()) {
    // Names given more than once in this instruction: sort the positions by name.
    std::vector<bool> repeated(n, false);
    if (n > 1) {
      std::vector<uint32_t> by_name(n);
      for (size_t i = 0; i < n; ++i) by_name[i] = static_cast<uint32_t>(i);
      std::sort(by_name.begin(), by_name.end(),
                [&](uint32_t a, uint32_t b) { return output_names[a] < output_names[b]; });
      for (size_t k = 1; k < n; ++k) {
        if (output_names[by_name[k]] == output_names[by_name[k - 1]]) {
          repeated[by_name[k]] = repeated[by_name[k - 1]] = true;
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      hashes[i] = HashName(output_names[i]);
      const size_t slot = FindSlot(output_names[i], hashes[i]);
      if (index_[slot].id != kNoValue || repeated[i]) {
        throw ProgramError(fmt::format("{}: value %{} is defined twice", where(), output_names[i]));
      }
      if (i == 0) first_slot = slot;
    }
    for (size_t i = 0; i < n; ++i) {
      if (output_names[i].empty()) {
        throw ProgramError(fmt::format("program '{}': a value needs a name", name_));
      }
    }
  }
  verified_ = false;
  const int32_t index = static_cast<int32_t>(instructions_.size());
  if (!attrs.empty()) attrs = *attrs_pool_.insert(std::move(attrs)).first;
  Instruction instr{&op, std::move(attrs), std::move(inputs), {}};
  for (size_t i = 0; i < n; ++i) {
    const TypeId type_id = InternType(out_types[i]);
    if (output_names.empty()) {
      instr.outputs.push_back(
          NewValue(FreshName(op.name), type_id, ValueKind::kIntermediate, index));
      continue;
    }
    const size_t slot = i == 0 ? first_slot : FindSlot(output_names[i], hashes[i]);
    const ValueId id = static_cast<ValueId>(values_.size());
    values_.push_back({std::move(output_names[i]), type_id, ValueKind::kIntermediate, index});
    index_[slot] = {id, hashes[i]};
    instr.outputs.push_back(id);
  }
  instructions_.push_back(std::move(instr));
  return instructions_.back().outputs;
}

void Program::BeginUnit(std::string name) {
  if (unit_open_) {
    throw ProgramError(fmt::format("unit '{}' opens inside unit '{}' (units do not nest)", name,
                                   units_.back().name));
  }
  for (const ProgramUnit& u : units_) {
    if (u.name == name) throw ProgramError(fmt::format("unit '{}' is defined twice", name));
  }
  const auto at = static_cast<int32_t>(instructions_.size());
  units_.push_back({std::move(name), at, at});
  unit_open_ = true;
}

void Program::EndUnit() {
  if (!unit_open_) throw ProgramError("EndUnit without an open unit");
  units_.back().end = static_cast<int32_t>(instructions_.size());
  unit_open_ = false;
}

void Program::AddOutput(ValueId id) {
  SLUICE_CHECK(id >= 0 && static_cast<size_t>(id) < values_.size());
  if (IsOutput(id)) return;
  is_output_.resize(values_.size(), false);
  is_output_[static_cast<size_t>(id)] = true;
  outputs_.push_back(id);
  verified_ = false;
}

void Program::Rename(ValueId id, std::string new_name) {
  SLUICE_CHECK(id >= 0 && static_cast<size_t>(id) < values_.size());
  if (values_[id].name == new_name) return;
  if (Find(new_name)) {
    throw ProgramError(fmt::format("program '{}': cannot rename %{} to %{}: the name is taken",
                                   name_, values_[id].name, new_name));
  }
  IndexErase(id);
  verified_ = false;
  values_[id].name = std::move(new_name);
  const uint32_t hash = HashName(values_[id].name);
  index_[FindSlot(values_[id].name, hash)] = {id, hash};
}

std::string_view Program::ReservedName(int32_t i) const {
  const size_t begin = i == 0 ? 0 : reserved_ends_[static_cast<size_t>(i) - 1];
  return std::string_view(reserved_chars_).substr(begin, reserved_ends_[i] - begin);
}

bool Program::IsReserved(std::string_view name) const {
  if (reserved_index_.empty()) return false;
  auto name_of = [&](int32_t i) { return ReservedName(i); };
  return reserved_index_[Probe(reserved_index_, name, HashName(name), name_of)].id != kNoValue;
}

namespace {

// "<prefix><n>" in `out`, whose first `prefix` characters are kept.
void AppendNumber(std::string& out, size_t prefix, int n) {
  char digits[16];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), n);
  out.resize(prefix);
  out.append(digits, end);
}

}  // namespace

void Program::ReserveName(std::string_view name) {
  if (!LooksFresh(name)) return;
  SLUICE_CHECK(reserved_ends_.size() < static_cast<size_t>(INT32_MAX), "too many reserved names");
  Reserve(reserved_index_, reserved_ends_.size() + 1);
  const uint32_t hash = HashName(name);
  auto name_of = [&](int32_t i) { return ReservedName(i); };
  IndexSlot& slot = reserved_index_[Probe(reserved_index_, name, hash, name_of)];
  if (slot.id != kNoValue) return;  // reserved already
  reserved_chars_.append(name);
  reserved_ends_.push_back(reserved_chars_.size());
  slot = {static_cast<ValueId>(reserved_ends_.size() - 1), hash};
}

std::string Program::FreshName(std::string_view hint) const {
  std::string candidate(hint);
  int& counter = fresh_counters_[candidate];
  candidate += '_';
  const size_t prefix = candidate.size();
  for (;;) {
    AppendNumber(candidate, prefix, counter++);
    if (!Find(candidate) && !IsReserved(candidate)) return candidate;
  }
}

size_t Program::Bytes(ValueId id) const {
  const TensorType& t = type(id);
  return static_cast<size_t>(t.shape.numel()) * SizeOf(t.dtype);
}

}  // namespace sluice
