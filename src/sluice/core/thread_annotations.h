// Thread-safety annotations: lock rules the compiler checks. Under clang, these macros expand to
// the attributes of its thread-safety analysis (-Wthread-safety; `make test` runs it, see
// docs/development.md), so that touching a guarded field without its lock, or calling a function
// that needs a lock without holding it, is a compile error. Under other compilers they expand to
// nothing and cost nothing.
//
// The rules are written on the declarations (LevelDB's db_impl.h, Abseil's mutex.h):
//
//   class Counter {
//    public:
//     void Add(int n) EXCLUDES(mu_) {      // takes mu_ itself; callers must not hold it
//       MutexLock lock(&mu_);
//       AddLocked(n);
//     }
//    private:
//     void AddLocked(int n) REQUIRES(mu_) { total_ += n; }  // callers hold mu_
//     Mutex mu_;
//     int64_t total_ GUARDED_BY(mu_) = 0;  // read or written only with mu_ held
//   };
//
// A capability is usually a sluice::Mutex (core/mutex.h); std::mutex is not annotated by
// libstdc++, so the analysis cannot see it. Constructors and destructors are not analysed (no other
// thread can see the object yet, or any more).
//
// What each macro says (the clang documentation, "Thread Safety Analysis", has the full story):
//   CAPABILITY(name)          on a class: its objects are capabilities (locks), `name` is how
//                             messages call them ("mutex").
//   SCOPED_CAPABILITY         on a class: an RAII holder that acquires in its constructor and
//                             releases in its destructor (MutexLock).
//   GUARDED_BY(mu)            on a field: read only holding mu (shared or exclusive), written only
//                             holding it exclusively.
//   PT_GUARDED_BY(mu)         on a pointer field: the same for what it points to (the pointer
//                             itself is unguarded).
//   REQUIRES(mu...)           on a function: callers must hold mu exclusively.
//   REQUIRES_SHARED(mu...)    the same, shared (reader) access suffices.
//   EXCLUDES(mu...)           callers must not hold mu (the function acquires it itself).
//   ACQUIRE(mu...)            the function acquires mu and returns holding it; without an argument
//                             on a capability's own method, it acquires `this`.
//   RELEASE(mu...)            the function releases mu (held on entry).
//   TRY_ACQUIRE(ok, mu...)    acquires mu when it returns `ok`.
//   ASSERT_CAPABILITY(mu)     after the call, the analysis treats mu as held (the function checks
//                             it, or the protocol guarantees it).
//   RETURN_CAPABILITY(mu)     the function returns a reference to mu (an accessor).
//   NO_THREAD_SAFETY_ANALYSIS the function is not analysed. Use sparingly, on the one small
//                             function that implements a protocol the analysis cannot follow, and
//                             say in a comment what protects the data instead.
#pragma once

#if defined(__clang__)
#define SLUICE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SLUICE_THREAD_ANNOTATION(x)  // no-op: only clang implements the analysis
#endif

#define CAPABILITY(name) SLUICE_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY SLUICE_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) SLUICE_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) SLUICE_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) SLUICE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) SLUICE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) SLUICE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) SLUICE_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) SLUICE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) SLUICE_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) SLUICE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) SLUICE_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) SLUICE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) SLUICE_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
#define EXCLUDES(...) SLUICE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) SLUICE_THREAD_ANNOTATION(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) SLUICE_THREAD_ANNOTATION(assert_shared_capability(x))
#define RETURN_CAPABILITY(x) SLUICE_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS SLUICE_THREAD_ANNOTATION(no_thread_safety_analysis)
