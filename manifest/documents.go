package manifest

import (
	"fmt"

	"github.com/inmesh/inmesh/internal/yamltree"
	"github.com/inmesh/inmesh/profiles"
)

// Document is one resource of a manifest file: its kind, namespace ("" for
// a ServiceProfile, known by its fully qualified name) and name, and the
// bytes of its YAML document alone.
type Document struct {
	Kind, Namespace, Name string
	Data                  []byte
}

// SplitResources validates a manifest file as [Parse] does (errors name the
// document and the field) and returns its resources one document each, in
// the file's order, for a store that keeps each resource under its own key.
// Blank documents are skipped.
func SplitResources(data []byte) ([]Document, error) {
	if _, err := Parse(data); err != nil {
		return nil, err
	}
	var out []Document
	for i, doc := range yamltree.SplitDocuments(data) {
		if yamltree.Blank(doc) {
			continue
		}
		r, err := Parse(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		objs := r.objects()
		if len(objs) != 1 {
			continue // a null document
		}
		o := objs[0]
		d := Document{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name, Data: doc}
		if len(r.ServiceProfiles) == 1 && o.Namespace == profiles.NamespaceOfName(o.Name) {
			// A ServiceProfile in its Service's namespace is named by
			// its fully qualified name alone; one in a client's
			// namespace carries that namespace.
			d.Namespace = ""
		}
		out = append(out, d)
	}
	return out, nil
}
