// C++ objects kept in an autograd context's saved_data (an IValue capsule),
// so that an op's backward finds what its forward used (an opened kernel
// bundle, one of its specs) without looking it up again.
#pragma once

#include <ATen/core/ivalue.h>

#include <memory>

namespace dflex::runtime {

struct SavedObjectHolder : torch::CustomClassHolder {
  explicit SavedObjectHolder(std::shared_ptr<const void> object) : object(std::move(object)) {}
  std::shared_ptr<const void> object;
};

/// A capsule holding `object` (and whatever an aliasing shared_ptr keeps alive).
template <typename T> c10::IValue saveObject(std::shared_ptr<const T> object) {
  return c10::IValue::make_capsule(c10::make_intrusive<SavedObjectHolder>(std::move(object)));
}

/// The object of a saveObject<T> capsule.
template <typename T> std::shared_ptr<const T> savedObject(const c10::IValue &capsule) {
  auto holder = c10::static_intrusive_pointer_cast<SavedObjectHolder>(capsule.toCapsule());
  return std::static_pointer_cast<const T>(holder->object);
}

} // namespace dflex::runtime
