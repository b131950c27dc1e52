// Package yamltree reads decoded YAML documents field by field, so that every
// error names the path of the field at fault (spec.routes[2].timeout).
package yamltree

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// Node is one value of a decoded YAML document with the path that names it
// in error messages (spec.routes[2].condition.pathRegex).
type Node struct {
	Path  string
	Value any
}

// Errorf returns an error prefixed with the node's path.
func (n Node) Errorf(format string, args ...any) error {
	if n.Path == "" {
		return fmt.Errorf(format, args...)
	}
	return fmt.Errorf("%s: %s", n.Path, fmt.Sprintf(format, args...))
}

// Child returns the path of the field name below n.
func (n Node) Child(name string) string {
	if n.Path == "" {
		return name
	}
	return n.Path + "." + name
}

// Object returns the fields of an object, rejecting any field not in known.
func (n Node) Object(known ...string) (map[string]Node, error) {
	m, ok := n.Value.(map[string]any)
	if !ok {
		return nil, n.Errorf("must be an object, not %s", kindOf(n.Value))
	}
	out := make(map[string]Node, len(m))
	for k, v := range m {
		if !contains(known, k) {
			return nil, Node{Path: n.Child(k)}.Errorf("unknown field (known: %s)", strings.Join(known, ", "))
		}
		out[k] = Node{Path: n.Child(k), Value: v}
	}
	return out, nil
}

// List returns the items of a list.
func (n Node) List() ([]Node, error) {
	l, ok := n.Value.([]any)
	if !ok {
		return nil, n.Errorf("must be a list, not %s", kindOf(n.Value))
	}
	out := make([]Node, len(l))
	for i, v := range l {
		out[i] = Node{Path: fmt.Sprintf("%s[%d]", n.Path, i), Value: v}
	}
	return out, nil
}

// Str returns a string.
func (n Node) Str() (string, error) {
	s, ok := n.Value.(string)
	if !ok {
		return "", n.Errorf("must be a string, not %s", kindOf(n.Value))
	}
	return s, nil
}

// Scalar returns a string or a number as text.
func (n Node) Scalar() (string, error) {
	switch v := n.Value.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	}
	return "", n.Errorf("must be a string or a number, not %s", kindOf(n.Value))
}

// Bool returns a boolean.
func (n Node) Bool() (bool, error) {
	b, ok := n.Value.(bool)
	if !ok {
		return false, n.Errorf("must be true or false, not %s", kindOf(n.Value))
	}
	return b, nil
}

// Uint32 returns a whole number that fits 32 bits.
func (n Node) Uint32() (uint32, error) {
	num, ok := n.Value.(json.Number)
	if !ok {
		return 0, n.Errorf("must be a whole number, not %s", kindOf(n.Value))
	}
	u, err := strconv.ParseUint(num.String(), 10, 32)
	if err != nil {
		return 0, n.Errorf("%s is not a whole number from 0 to %d", num, uint32(math.MaxUint32))
	}
	return uint32(u), nil
}

// Float32 returns a number as a 32-bit float.
func (n Node) Float32() (float32, error) {
	num, ok := n.Value.(json.Number)
	if !ok {
		return 0, n.Errorf("must be a number, not %s", kindOf(n.Value))
	}
	f, err := strconv.ParseFloat(num.String(), 32)
	if err != nil {
		return 0, n.Errorf("%s is not a number", num)
	}
	return float32(f), nil
}

// Duration returns a Go duration string (300ms) as a non-negative duration.
func (n Node) Duration() (time.Duration, error) {
	s, err := n.Str()
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, n.Errorf("%q is not a duration (like 300ms or 10s)", s)
	}
	if d < 0 {
		return 0, n.Errorf("%q is negative", s)
	}
	return d, nil
}

func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// SortedKeys returns the keys of m in order, for deterministic errors.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Decode parses one YAML document into a tree of maps, lists, strings,
// json.Number values and booleans. The root has an empty path. A key that
// appears twice in one object is an error naming its path and lines (YAML
// forbids it; the decoder underneath would keep the last value silently).
func Decode(doc []byte) (Node, error) {
	if err := checkDuplicateKeys(doc); err != nil {
		return Node{}, err
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return Node{}, fmt.Errorf("bad YAML: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Node{}, fmt.Errorf("bad YAML: %w", err)
	}
	return Node{Value: v}, nil
}

// SplitDocuments splits a YAML stream at the lines that are exactly "---"
// (optionally followed by space or a comment).
func SplitDocuments(data []byte) [][]byte {
	var docs [][]byte
	start := 0
	for off := 0; off < len(data); {
		line := data[off:]
		next := len(data)
		if end := bytes.IndexByte(line, '\n'); end >= 0 {
			line = line[:end]
			next = off + end + 1
		}
		if t := bytes.TrimRight(line, " \t\r"); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- #")) {
			docs = append(docs, data[start:off])
			start = next
		}
		off = next
	}
	return append(docs, data[start:])
}

// Blank reports whether a document holds nothing but space and comments.
func Blank(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// checkDuplicateKeys reports the first key defined twice in one mapping of
// doc. A document the node parser cannot read is left to the decoder, which
// reports its own error.
func checkDuplicateKeys(doc []byte) error {
	var root yaml3.Node
	if err := yaml3.Unmarshal(doc, &root); err != nil {
		return nil
	}
	return duplicateKeys(&root, "")
}

func duplicateKeys(n *yaml3.Node, path string) error {
	switch n.Kind {
	case yaml3.DocumentNode:
		for _, c := range n.Content {
			if err := duplicateKeys(c, path); err != nil {
				return err
			}
		}
	case yaml3.SequenceNode:
		for i, c := range n.Content {
			if err := duplicateKeys(c, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case yaml3.MappingNode:
		seen := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml3.ScalarNode || k.Value == "<<" {
				continue // merge keys and complex keys are the decoder's business
			}
			child := Node{Path: path}.Child(k.Value)
			if line, dup := seen[k.Value]; dup {
				return Node{Path: child}.Errorf("duplicate key %q (first on line %d, again on line %d)", k.Value, line, k.Line)
			}
			seen[k.Value] = k.Line
			if err := duplicateKeys(v, child); err != nil {
				return err
			}
		}
	}
	// Aliases are not followed: their target was checked where it is
	// defined, and following them could expand a small document hugely.
	return nil
}
