package manifest

import (
	"github.com/inmesh/inmesh/internal/yamltree"
	"github.com/inmesh/inmesh/policy"
)

// parseRuleFilters reads the filters of an HTTPRoute rule, or with grpc of
// a GRPCRoute rule: the RequestMirror filters apart (they become the
// rule's mirrors), the others as parseFilters does.
func parseRuleFilters(n yamltree.Node, ns string, grpc bool) ([]policy.Filter, []MirrorRef, error) {
	if n.Value == nil {
		return nil, nil, nil
	}
	items, err := n.List()
	if err != nil {
		return nil, nil, err
	}
	var rest []yamltree.Node
	var mirrors []MirrorRef
	for _, item := range items {
		known := []string{"type", "requestHeaderModifier", "responseHeaderModifier", "requestRedirect", "requestMirror"}
		if grpc {
			known = []string{"type", "requestHeaderModifier", "requestMirror"}
		}
		obj, err := item.Object(known...)
		if err != nil {
			return nil, nil, err
		}
		if typ, _ := optionalString(obj, "type"); typ != "RequestMirror" {
			if _, ok := obj["requestMirror"]; ok {
				return nil, nil, yamltree.Node{Path: item.Child("requestMirror")}.Errorf("not allowed with type %q", typ)
			}
			rest = append(rest, item)
			continue
		}
		m, err := parseMirror(item, obj, ns)
		if err != nil {
			return nil, nil, err
		}
		mirrors = append(mirrors, m)
	}
	if len(rest) == 0 {
		return nil, mirrors, nil
	}
	filters, err := parseFilters(yamltree.Node{Path: n.Path, Value: n.Value}, grpc, rest...)
	return filters, mirrors, err
}

// parseMirror reads a RequestMirror filter: requestMirror.backendRef (a
// Service with a port), and at most one of percent (0-100) and fraction
// (numerator, denominator defaulting to 100).
func parseMirror(item yamltree.Node, obj map[string]yamltree.Node, ns string) (MirrorRef, error) {
	m := MirrorRef{Namespace: ns}
	mn, ok := obj["requestMirror"]
	if !ok || mn.Value == nil {
		return m, yamltree.Node{Path: item.Child("requestMirror")}.Errorf("required by type")
	}
	mo, err := mn.Object("backendRef", "percent", "fraction")
	if err != nil {
		return m, err
	}
	bn, ok := mo["backendRef"]
	if !ok || bn.Value == nil {
		return m, yamltree.Node{Path: mn.Child("backendRef")}.Errorf("required")
	}
	bo, err := bn.Object("group", "kind", "name", "namespace", "port")
	if err != nil {
		return m, err
	}
	group, err := optionalString(bo, "group")
	if err != nil {
		return m, err
	}
	kind, err := optionalString(bo, "kind")
	if err != nil {
		return m, err
	}
	if (group != "" && group != "core") || (kind != "" && kind != "Service") {
		return m, bn.Errorf("backend %s/%s is not a Service (only Service backends are supported)", group, kind)
	}
	if m.Name, err = requiredString(bn, bo, "name"); err != nil {
		return m, err
	}
	if nn, ok := bo["namespace"]; ok {
		if m.Namespace, err = nn.Str(); err != nil {
			return m, err
		}
	}
	pn, ok := bo["port"]
	if !ok {
		return m, yamltree.Node{Path: bn.Child("port")}.Errorf("required for a Service")
	}
	if m.Port, err = port(pn); err != nil {
		return m, err
	}
	pcn, hasPercent := mo["percent"]
	fn, hasFraction := mo["fraction"]
	switch {
	case hasPercent && hasFraction:
		return m, mn.Errorf("only one of percent or fraction may be specified")
	case hasPercent:
		p, err := pcn.Uint32()
		if err != nil {
			return m, err
		}
		if p > 100 {
			return m, pcn.Errorf("%d is more than 100", p)
		}
		m.Ratio = policy.Ratio{Numerator: p, Denominator: 100}
	case hasFraction:
		fo, err := fn.Object("numerator", "denominator")
		if err != nil {
			return m, err
		}
		nn, ok := fo["numerator"]
		if !ok {
			return m, yamltree.Node{Path: fn.Child("numerator")}.Errorf("required")
		}
		num, err := nn.Uint32()
		if err != nil {
			return m, err
		}
		den := uint32(100)
		if dn, ok := fo["denominator"]; ok {
			if den, err = dn.Uint32(); err != nil {
				return m, err
			}
			if den == 0 {
				return m, dn.Errorf("must be at least 1")
			}
		}
		if num > den {
			return m, fn.Errorf("numerator %d is more than denominator %d", num, den)
		}
		m.Ratio = policy.Ratio{Numerator: num, Denominator: den}
	}
	return m, nil
}

// mirrors resolves a rule's mirrors: a mirror of a Service with a manifest
// goes to name.ns.svc.cluster.local:port; one of an unknown Service is
// dropped, as the Gateway API says of a mirror whose referent cannot be
// found.
func (r *Resources) mirrors(refs []MirrorRef) []policy.Mirror {
	var out []policy.Mirror
	for _, ref := range refs {
		if r.Service(ref.Namespace, ref.Name) == nil {
			continue
		}
		out = append(out, policy.Mirror{
			Meta:      policy.Metadata{Group: "core", Kind: "Service", Namespace: ref.Namespace, Name: ref.Name, Port: ref.Port},
			Authority: Authority(ref.Namespace, ref.Name, ref.Port),
			Ratio:     ref.Ratio,
		})
	}
	return out
}
