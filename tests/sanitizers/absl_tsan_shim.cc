// abseil's synchronisation as ThreadSanitizer sees it, for the TSan build
// (sanitizers.cmake links this into every executable).
//
// Debian's libabsl is not built with TSan, so TSan does not see absl::Mutex
// lock or unlock (they spin and wait on futexes inside the library) and would
// report every access to ABSL_GUARDED_BY state as a race. This file defines
// the public blocking members of Mutex, CondVar, ReleasableMutexLock and
// Notification (and Status's reference count) in the executable: the dynamic linker binds every call (ours,
// and gRPC's through its PLT) here; each calls the library's own definition
// (dlsym RTLD_NEXT) and tells TSan what it did as a happens-before edge on
// the object's address: a release before unlocking (or before waiting, which
// unlocks), an acquire after locking (or after waiting, which locks again).
// Accesses inside the library (abseil evaluates a waiter's Condition on the
// unlocking thread) are ignored.
//
// What TSan then still finds: every access to shared state not ordered by an
// abseil or std lock, an atomic or a thread start/join. What it does not:
// lock-order inversions of abseil mutexes (no ownership is modelled).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();
}

namespace {

#define HSDP_SHIM_STR2(x) #x
#define HSDP_SHIM_STR(x) HSDP_SHIM_STR2(x)

// The library's definition of absl::<inline namespace>::<suffix>.
void* Real(const char* suffix, bool is_const = false) {
  const std::string ns = HSDP_SHIM_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                           std::to_string(ns.size()) + ns + suffix;
  void* f = ::dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_tsan_shim: %s not found in libabsl\n", name.c_str());
    std::abort();
  }
  return f;
}

struct Ignored {
  Ignored() { __tsan_ignore_thread_begin(); }
  ~Ignored() { __tsan_ignore_thread_end(); }
};

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

}  // namespace

#define HSDP_REAL(type, ...) static const auto real = reinterpret_cast<type>(Real(__VA_ARGS__))

namespace absl {
ABSL_NAMESPACE_BEGIN

// --- Mutex: lock (acquire after) ---
void Mutex::Lock() {
  HSDP_REAL(void (*)(Mutex*), "5Mutex4LockEv");
  { Ignored i; real(this); }
  Acquire(this);
}
void Mutex::ReaderLock() {
  HSDP_REAL(void (*)(Mutex*), "5Mutex10ReaderLockEv");
  { Ignored i; real(this); }
  Acquire(this);
}
bool Mutex::TryLock() {
  HSDP_REAL(bool (*)(Mutex*), "5Mutex7TryLockEv");
  bool ok;
  { Ignored i; ok = real(this); }
  if (ok) Acquire(this);
  return ok;
}
bool Mutex::ReaderTryLock() {
  HSDP_REAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv");
  bool ok;
  { Ignored i; ok = real(this); }
  if (ok) Acquire(this);
  return ok;
}
void Mutex::LockWhen(const Condition& c) {
  HSDP_REAL(void (*)(Mutex*, const Condition&), "5Mutex8LockWhenERKNS0_9ConditionE");
  { Ignored i; real(this, c); }
  Acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& c) {
  HSDP_REAL(void (*)(Mutex*, const Condition&), "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  { Ignored i; real(this, c); }
  Acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& c, Duration d) {
  HSDP_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r;
  { Ignored i; r = real(this, c, d); }
  Acquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& c, Time t) {
  HSDP_REAL(bool (*)(Mutex*, const Condition&, Time),
            "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r;
  { Ignored i; r = real(this, c, t); }
  Acquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& c, Duration d) {
  HSDP_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r;
  { Ignored i; r = real(this, c, d); }
  Acquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& c, Time t) {
  HSDP_REAL(bool (*)(Mutex*, const Condition&, Time),
            "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r;
  { Ignored i; r = real(this, c, t); }
  Acquire(this);
  return r;
}

// --- Mutex: unlock (release before) ---
void Mutex::Unlock() {
  HSDP_REAL(void (*)(Mutex*), "5Mutex6UnlockEv");
  Release(this);
  Ignored i;
  real(this);
}
void Mutex::ReaderUnlock() {
  HSDP_REAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv");
  Release(this);
  Ignored i;
  real(this);
}
void ReleasableMutexLock::Release() {
  HSDP_REAL(void (*)(ReleasableMutexLock*), "19ReleasableMutexLock7ReleaseEv");
  static_assert(sizeof(ReleasableMutexLock) == sizeof(Mutex*));
  ::Release(*reinterpret_cast<Mutex* const*>(this));  // its only member, mu_
  Ignored i;
  real(this);
}

// --- waits that unlock and lock again (release before, acquire after) ---
void Mutex::Await(const Condition& c) {
  HSDP_REAL(void (*)(Mutex*, const Condition&), "5Mutex5AwaitERKNS0_9ConditionE");
  Release(this);
  { Ignored i; real(this, c); }
  Acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& c, Duration d) {
  HSDP_REAL(bool (*)(Mutex*, const Condition&, Duration),
            "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Release(this);
  bool r;
  { Ignored i; r = real(this, c, d); }
  Acquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& c, Time t) {
  HSDP_REAL(bool (*)(Mutex*, const Condition&, Time),
            "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Release(this);
  bool r;
  { Ignored i; r = real(this, c, t); }
  Acquire(this);
  return r;
}
void CondVar::Wait(Mutex* mu) {
  HSDP_REAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  { Ignored i; real(this, mu); }
  Acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration d) {
  HSDP_REAL(bool (*)(CondVar*, Mutex*, Duration), "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  bool r;
  { Ignored i; r = real(this, mu, d); }
  Acquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time t) {
  HSDP_REAL(bool (*)(CondVar*, Mutex*, Time), "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  bool r;
  { Ignored i; r = real(this, mu, t); }
  Acquire(mu);
  return r;
}

// --- Notification: Notify releases, a wait that saw it acquires. The
// inline HasBeenNotified() reads notified_yet_ with an acquire load, so the
// release is also made on that member's address. ---
namespace {
const void* NotifiedFlag(const Notification* n) {
  static_assert(sizeof(Notification) == 2 * sizeof(Mutex), "Notification is {Mutex, atomic<bool>}");
  return reinterpret_cast<const char*>(n) + sizeof(Mutex);
}
}  // namespace
void Notification::Notify() {
  HSDP_REAL(void (*)(Notification*), "12Notification6NotifyEv");
  Release(this);
  Release(NotifiedFlag(this));
  Ignored i;
  real(this);
}
void Notification::WaitForNotification() const {
  HSDP_REAL(void (*)(const Notification*), "12Notification19WaitForNotificationEv", true);
  { Ignored i; real(this); }
  Acquire(this);
}
bool Notification::WaitForNotificationWithTimeout(Duration d) const {
  HSDP_REAL(bool (*)(const Notification*, Duration),
            "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  bool r;
  { Ignored i; r = real(this, d); }
  if (r) Acquire(this);
  return r;
}
bool Notification::WaitForNotificationWithDeadline(Time t) const {
  HSDP_REAL(bool (*)(const Notification*, Time),
            "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  bool r;
  { Ignored i; r = real(this, t); }
  if (r) Acquire(this);
  return r;
}

// --- Status: its shared representation is reference-counted inside the
// library; the copy whose Unref frees it must be seen after every other
// copy's last use. Each Unref releases, and acquires what the others
// released before it may free. ---
void Status::UnrefNonInlined(uintptr_t rep) {
  HSDP_REAL(void (*)(uintptr_t), "6Status15UnrefNonInlinedEm");
  void* p = reinterpret_cast<void*>(rep);
  Release(p);
  Acquire(p);
  real(rep);  // its free goes through TSan's interceptor, now ordered
}

ABSL_NAMESPACE_END
}  // namespace absl
