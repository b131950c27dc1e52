package registry

import "sync"

// First says when an authority's first answer from its source arrived (a
// state, a "none", a rejection): Done is closed then. A nil *First is
// answered from the start. It is safe for concurrent use.
type First struct {
	once sync.Once
	ch   chan struct{}
}

// NewFirst returns a First whose answer has not arrived.
func NewFirst() *First { return &First{ch: make(chan struct{})} }

// Answered records the first answer; later calls do nothing.
func (f *First) Answered() {
	if f != nil {
		f.once.Do(func() { close(f.ch) })
	}
}

// Done is closed once the first answer arrived.
func (f *First) Done() <-chan struct{} {
	if f == nil {
		return closed
	}
	return f.ch
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
