// Package recache compiles regular expressions, and what callers derive
// from them, once per process: the route tables of a profile or a policy
// are rebuilt on every update, and most updates repeat the patterns of the
// one before (a control plane resends a profile whose names or weights
// changed; the outbound and inbound routers of one process compile the
// same profile). A compiled [regexp.Regexp] is immutable and safe for
// concurrent use, so one value serves every table that names the pattern.
package recache

import (
	"regexp"
	"strings"
	"sync"
)

// MaxEntries bounds the values a [Memo] keeps; past it an arbitrary entry
// makes room. Patterns come from the control plane, whose profiles and
// routes are bounded in number and in pattern length, so in practice
// every pattern in use fits.
const MaxEntries = 4096

// Memo keeps the value built from each pattern. The zero Memo is ready to
// use; it is safe for concurrent use. Values must be immutable.
type Memo[V any] struct {
	mu sync.Mutex
	m  map[string]V
}

// Get returns the value kept for pattern, or builds it with build and
// keeps it. Errors are not kept: a bad pattern is refused before it could
// be kept, and refusing it again costs what it cost the first time.
func (c *Memo[V]) Get(pattern string, build func(string) (V, error)) (V, error) {
	c.mu.Lock()
	v, ok := c.m[pattern]
	c.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := build(pattern)
	if err != nil {
		return v, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[pattern]; ok {
		return prev, nil // a concurrent caller built it first
	}
	if c.m == nil {
		c.m = make(map[string]V)
	}
	if len(c.m) >= MaxEntries {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[pattern] = v
	return v, nil
}

// Len returns the number of values kept.
func (c *Memo[V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

var regexps Memo[*regexp.Regexp]

// Compile is [regexp.Compile] with the result kept for the next caller of
// the same pattern.
func Compile(pattern string) (*regexp.Regexp, error) { return regexps.Get(pattern, regexp.Compile) }

// CompileAnchored compiles a ServiceProfile path pattern as Linkerd's
// proxy does (linkerd2-proxy, linkerd/service-profiles/src/proto.rs,
// convert_req_match): surrounding space trimmed, then ^ put before it
// unless it starts with ^ and $ after it unless it ends with $, without a
// group. An alternation is therefore anchored at its ends only: "/a|/b"
// is "^/a|/b$", which matches "/ab". The result is kept as [Compile] keeps
// it. A pattern that is not a regular expression on its own is refused
// with the error of the pattern as written, which names what the user
// wrote rather than the anchored form built from it.
func CompileAnchored(pattern string) (*regexp.Regexp, error) {
	pattern = strings.TrimSpace(pattern)
	if _, err := Compile(pattern); err != nil {
		return nil, err
	}
	return Compile(Anchored(pattern))
}

// Anchored is the pattern [CompileAnchored] compiles.
func Anchored(pattern string) string {
	pattern = strings.TrimSpace(pattern)
	if !strings.HasPrefix(pattern, "^") {
		pattern = "^" + pattern
	}
	if !strings.HasSuffix(pattern, "$") {
		pattern += "$"
	}
	return pattern
}
