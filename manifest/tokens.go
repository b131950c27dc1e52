package manifest

import (
	"errors"

	"github.com/inmesh/inmesh/internal/yamltree"
)

// Token is one entry of a tokens file: the stand-in for Kubernetes'
// TokenReview in the embedded control plane, saying which service account
// a token proves.
type Token struct {
	Token          string
	ServiceAccount string
	Namespace      string
}

// ParseTokens reads a tokens file: a YAML list of tokens and the service
// accounts they prove.
//
//   - token: 3f1c0a...            # the bytes of the token file a workload reads
//     serviceAccount: books
//     namespace: default
//
// Every field is required; the service account and namespace are DNS
// labels; a token listed twice is an error. An empty file is refused, as
// for the endpoints file: write [] for no tokens. Errors name the field,
// as in "[1].namespace: required".
func ParseTokens(data []byte) ([]Token, error) {
	if yamltree.Blank(data) {
		return nil, errEmptyTokens
	}
	root, err := yamltree.Decode(data)
	if err != nil {
		return nil, err
	}
	if root.Value == nil {
		return nil, errEmptyTokens
	}
	entries, err := root.List()
	if err != nil {
		return nil, err
	}
	out := make([]Token, 0, len(entries))
	seen := make(map[string]bool, len(entries))
	for _, entry := range entries {
		obj, err := entry.Object("token", "serviceAccount", "namespace")
		if err != nil {
			return nil, err
		}
		var t Token
		for _, f := range []struct {
			name  string
			dst   *string
			label bool
		}{{"token", &t.Token, false}, {"serviceAccount", &t.ServiceAccount, true}, {"namespace", &t.Namespace, true}} {
			n, ok := obj[f.name]
			if !ok {
				return nil, yamltree.Node{Path: entry.Child(f.name)}.Errorf("required")
			}
			if *f.dst, err = n.Str(); err != nil {
				return nil, err
			}
			if *f.dst == "" {
				return nil, n.Errorf("required")
			}
			if f.label && !isDNSLabel(*f.dst) {
				return nil, n.Errorf("%q is not a DNS label", *f.dst)
			}
		}
		if seen[t.Token] {
			return nil, obj["token"].Errorf("the token is listed twice")
		}
		seen[t.Token] = true
		out = append(out, t)
	}
	return out, nil
}

var errEmptyTokens = errors.New("the tokens file is empty (truncated, or still being written?); write [] for no tokens")
