package registry

import (
	"hash/maphash"
	"sync/atomic"
)

// index maps the keys of a registry (authorities and the raw spellings
// cached for them) to their entries. Lookups take no lock and allocate
// nothing; changes are made under the registry's mu.
//
// It is a chained hash table whose nodes never change once published: a
// change replaces the nodes it touches, and growing builds a new table,
// so a lookup reads a consistent chain whichever change it races with.
// A key costs a node of three words and about one bucket word, where a
// sync.Map costs several times that: a proxy holds a key in each of four
// registries for each of the thousands of names it watches.
type index[S any] struct {
	tab  atomic.Pointer[indexTable[S]]
	seed maphash.Seed
	n    int // keys; guarded by the registry's mu
}

type indexTable[S any] struct {
	buckets []atomic.Pointer[indexNode[S]]
	mask    uint64
}

type indexNode[S any] struct {
	key  string
	e    *Entry[S]
	next *indexNode[S]
}

// minBuckets is the size of the first table.
const minBuckets = 16

func newIndex[S any]() *index[S] {
	x := &index[S]{seed: maphash.MakeSeed()}
	x.tab.Store(newIndexTable[S](minBuckets))
	return x
}

func newIndexTable[S any](n int) *indexTable[S] {
	return &indexTable[S]{buckets: make([]atomic.Pointer[indexNode[S]], n), mask: uint64(n - 1)}
}

// load returns the entry of key, nil when there is none.
func (x *index[S]) load(key string) *Entry[S] {
	t := x.tab.Load()
	for n := t.buckets[maphash.String(x.seed, key)&t.mask].Load(); n != nil; n = n.next {
		if n.key == key {
			return n.e
		}
	}
	return nil
}

// store maps key to e. The caller holds the registry's mu.
func (x *index[S]) store(key string, e *Entry[S]) {
	t := x.tab.Load()
	b := &t.buckets[maphash.String(x.seed, key)&t.mask]
	if head, ok := without(b.Load(), key, nil); ok {
		b.Store(&indexNode[S]{key: key, e: e, next: head})
		return
	}
	if x.n >= len(t.buckets) {
		t = x.grow(t)
		b = &t.buckets[maphash.String(x.seed, key)&t.mask]
	}
	b.Store(&indexNode[S]{key: key, e: e, next: b.Load()})
	x.n++
}

// compareAndDelete removes key if it maps to e. The caller holds the
// registry's mu.
func (x *index[S]) compareAndDelete(key string, e *Entry[S]) {
	t := x.tab.Load()
	b := &t.buckets[maphash.String(x.seed, key)&t.mask]
	if head, ok := without(b.Load(), key, e); ok {
		b.Store(head)
		x.n--
	}
}

// len returns the number of keys. The caller holds the registry's mu.
func (x *index[S]) len() int { return x.n }

// without returns the chain from head without the node of key (only if
// it maps to e, when e is not nil), copying the nodes before it, and
// whether there was such a node; head itself when there was none.
func without[S any](head *indexNode[S], key string, e *Entry[S]) (*indexNode[S], bool) {
	var found *indexNode[S]
	for n := head; n != nil; n = n.next {
		if n.key == key {
			found = n
			break
		}
	}
	if found == nil || e != nil && found.e != e {
		return head, false
	}
	rest := found.next
	if head == found {
		return rest, true
	}
	// Copy the nodes before found, in order, onto rest.
	var before []*indexNode[S]
	for n := head; n != found; n = n.next {
		before = append(before, n)
	}
	for i := len(before) - 1; i >= 0; i-- {
		rest = &indexNode[S]{key: before[i].key, e: before[i].e, next: rest}
	}
	return rest, true
}

// grow replaces t with a table of twice the buckets and returns it.
func (x *index[S]) grow(t *indexTable[S]) *indexTable[S] {
	nt := newIndexTable[S](2 * len(t.buckets))
	for i := range t.buckets {
		for n := t.buckets[i].Load(); n != nil; n = n.next {
			b := &nt.buckets[maphash.String(x.seed, n.key)&nt.mask]
			b.Store(&indexNode[S]{key: n.key, e: n.e, next: b.Load()})
		}
	}
	x.tab.Store(nt)
	return nt
}
