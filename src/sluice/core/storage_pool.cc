#include "sluice/core/storage_pool.h"

#include <atomic>
#include <climits>

#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SLUICE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SLUICE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SLUICE_POISON(p, n) ((void)(p), (void)(n))
#define SLUICE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace sluice {

namespace {

// The links of a free node, kept in its last bytes; the first kLinkOffset bytes (where the control
// block and the Storage live) are poisoned while the node is free under AddressSanitizer, so a
// use of a dead Storage is still reported. In a chain of the process-wide list, the chain's first
// node also holds the next chain and the chain's length.
struct Node {
  Node* next;
  Node* next_chain;
  int length;
};
constexpr size_t kLinkOffset = 64;
static_assert(kLinkOffset + sizeof(Node) <= StoragePool::kNodeBytes);

Node* LinksOf(void* p) { return reinterpret_cast<Node*>(static_cast<char*>(p) + kLinkOffset); }
void* NodeOf(Node* links) { return reinterpret_cast<char*>(links) - kLinkOffset; }

// A slab's link to the slab before it, ahead of its nodes (which stay kNodeAlign-aligned).
constexpr size_t kSlabHeader = StoragePool::kNodeAlign;
static_assert(kSlabHeader >= sizeof(void*) && kSlabHeader % StoragePool::kNodeAlign == 0);
static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= StoragePool::kNodeAlign);

// The process-wide list of chains and the slabs. Never destroyed: storages may die during static
// destruction and thread exit after it.
struct Global {
  Mutex mu;
  Node* chains GUARDED_BY(mu) = nullptr;
  int64_t free_nodes GUARDED_BY(mu) = 0;
  // The newest slab; each slab's first kSlabHeader bytes point to the one before. Keeps every
  // node reachable (leak checkers) without a heap allocation of its own: a slab is exactly one
  // operator new, which is what SlabsAllocated counts.
  void* slabs GUARDED_BY(mu) = nullptr;
  std::atomic<int64_t> num_slabs{0};
};

Global& TheGlobal() {
  static Global* const global = new Global();
  return *global;
}

// Pushes the chain head..(length nodes) onto the process-wide list.
void PushChain(Node* head, int length) {
  head->length = length;
  Global& g = TheGlobal();
  MutexLock lock(&g.mu);
  head->next_chain = g.chains;
  g.chains = head;
  g.free_nodes += length;
}

// A chain from the process-wide list, or a new slab's nodes as one chain; sets *length.
Node* PopChain(int* length) {
  Global& g = TheGlobal();
  {
    MutexLock lock(&g.mu);
    if (Node* head = g.chains; head != nullptr) {
      g.chains = head->next_chain;
      g.free_nodes -= head->length;
      *length = head->length;
      return head;
    }
  }
  auto* slab = static_cast<char*>(
      ::operator new(kSlabHeader + StoragePool::kBatch * StoragePool::kNodeBytes));
  Node* head = nullptr;
  for (int i = StoragePool::kBatch - 1; i >= 0; --i) {
    char* node = slab + kSlabHeader + static_cast<size_t>(i) * StoragePool::kNodeBytes;
    SLUICE_POISON(node, kLinkOffset);
    LinksOf(node)->next = head;
    head = LinksOf(node);
  }
  {
    MutexLock lock(&g.mu);
    *reinterpret_cast<void**>(slab) = g.slabs;
    g.slabs = slab;
  }
  g.num_slabs.fetch_add(1, std::memory_order_relaxed);
  *length = StoragePool::kBatch;
  return head;
}

// The calling thread's free list. Trivially destructible, so the fast path reads it without a
// guard. `count` starts at kThreadNodes, so that a thread's first Give, like its first Take, takes
// the slow path, which registers the thread's exit; it is kGone once the exit has handed the list
// over.
constexpr int kGone = INT_MAX;
struct ThreadList {
  Node* head = nullptr;
  int count = StoragePool::kThreadNodes;
  bool registered = false;
};
thread_local constinit ThreadList tl_list;

// Its destructor (at thread exit) moves the thread's list to the process-wide list.
struct ThreadListOwner {
  ~ThreadListOwner() {
    ThreadList& t = tl_list;
    if (t.head != nullptr) PushChain(t.head, t.count);
    t.head = nullptr;
    t.count = kGone;
  }
};

// Called on the thread's first Take or Give: its list is empty.
void RegisterThreadExit(ThreadList& t) {
  thread_local ThreadListOwner owner;
  (void)owner;  // odr-use: constructs it, and so registers its destructor
  t.registered = true;
  t.count = 0;
}

// The node of `links`, ready for its caller.
void* Hand(Node* links) {
  void* node = NodeOf(links);
  SLUICE_UNPOISON(node, kLinkOffset);
  return node;
}

}  // namespace

void* StoragePool::Take() {
  ThreadList& t = tl_list;
  if (Node* node = t.head; node != nullptr) {
    t.head = node->next;
    --t.count;
    return Hand(node);
  }
  if (t.count == kGone) {  // thread exit: one node, the rest of the chain back
    int length = 0;
    Node* head = PopChain(&length);
    if (length > 1) PushChain(head->next, length - 1);
    return Hand(head);
  }
  if (!t.registered) RegisterThreadExit(t);
  int length = 0;
  Node* head = PopChain(&length);
  t.head = head->next;
  t.count = length - 1;
  return Hand(head);
}

void StoragePool::Give(void* p) noexcept {
  SLUICE_POISON(p, kLinkOffset);
  Node* node = LinksOf(p);
  ThreadList& t = tl_list;
  if (t.count < kThreadNodes) {
    node->next = t.head;
    t.head = node;
    ++t.count;
    return;
  }
  if (t.count == kGone) {
    node->next = nullptr;
    PushChain(node, 1);
    return;
  }
  if (!t.registered) {
    RegisterThreadExit(t);
    node->next = nullptr;
    t.head = node;
    t.count = 1;
    return;
  }
  // Full: the newest kBatch nodes go to the process-wide list as one chain.
  Node* chain = t.head;
  Node* last = chain;
  for (int i = 1; i < kBatch; ++i) last = last->next;
  t.head = last->next;
  t.count -= kBatch;
  last->next = nullptr;
  PushChain(chain, kBatch);
  node->next = t.head;
  t.head = node;
  ++t.count;
}

int64_t StoragePool::SlabsAllocated() {
  return TheGlobal().num_slabs.load(std::memory_order_relaxed);
}

int64_t StoragePool::GlobalFreeNodes() {
  Global& g = TheGlobal();
  MutexLock lock(&g.mu);
  return g.free_nodes;
}

}  // namespace sluice
