package manifest

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/inmesh/inmesh/internal/yamltree"
	"github.com/inmesh/inmesh/policy"
)

// HTTPRoute is an HTTPRoute resource.
type HTTPRoute struct {
	Object
	ParentRefs []ParentRef
	Hostnames  []string
	Rules      []HTTPRouteRule
}

// HTTPRouteRule is one rule of an HTTPRoute. Its backends are resolved
// against the known Services by [Resources.Policy].
type HTTPRouteRule struct {
	Matches     []policy.HTTPRouteMatch
	Filters     []policy.Filter
	BackendRefs []BackendRef
	// Timeouts are the rule's timeouts field: request is the request
	// timeout, backendRequest the response timeout. Nil when absent.
	Timeouts *policy.Timeouts
	// Mirrors are the rule's RequestMirror filters, in order.
	Mirrors []MirrorRef
}

// MirrorRef is a RequestMirror filter of an HTTPRoute or GRPCRoute rule: a Service port
// that gets a copy of a share of the rule's requests.
type MirrorRef struct {
	Namespace, Name string
	Port            uint16
	// Ratio is the share (percent n is n/100, a fraction as given); the
	// zero Ratio means every request.
	Ratio policy.Ratio
}

// GRPCRoute is a GRPCRoute resource.
type GRPCRoute struct {
	Object
	ParentRefs []ParentRef
	Hostnames  []string
	Rules      []GRPCRouteRule
}

// GRPCRouteRule is one rule of a GRPCRoute.
type GRPCRouteRule struct {
	Matches     []policy.GRPCRouteMatch
	Filters     []policy.Filter
	BackendRefs []BackendRef
	Timeouts    *policy.Timeouts
	// Mirrors are the rule's RequestMirror filters, in order.
	Mirrors []MirrorRef
}

// ParentRef is a parent of a route. Only Service parents (kind Service,
// core group) attach a route to a Service's policy; others are kept and
// ignored.
type ParentRef struct {
	Group, Kind, Namespace, Name string
	// Port is the Service port; zero means every port.
	Port uint16
	// SectionName is the parent's sectionName, "" when absent.
	SectionName string
}

// IsService reports whether the parent is a Service.
func (p ParentRef) IsService() bool {
	return p.Kind == "Service" && (p.Group == "" || p.Group == "core")
}

// BackendRef is a backend of a rule: a Service port with a weight.
type BackendRef struct {
	Namespace, Name string
	// Port is the Service port; zero means the parent's port.
	Port    uint16
	Weight  uint32
	Filters []policy.Filter
}

var routeSpecFields = []string{"parentRefs", "hostnames", "rules"}

func parseCommon(spec yamltree.Node, ns string) (map[string]yamltree.Node, []ParentRef, []string, error) {
	obj, err := spec.Object(routeSpecFields...)
	if err != nil {
		return nil, nil, nil, err
	}
	var parents []ParentRef
	if pn, ok := obj["parentRefs"]; ok && pn.Value != nil {
		items, err := pn.List()
		if err != nil {
			return nil, nil, nil, err
		}
		for _, item := range items {
			p, err := parseParentRef(item, ns)
			if err != nil {
				return nil, nil, nil, err
			}
			parents = append(parents, p)
		}
	}
	var hosts []string
	if hn, ok := obj["hostnames"]; ok && hn.Value != nil {
		items, err := hn.List()
		if err != nil {
			return nil, nil, nil, err
		}
		for _, item := range items {
			h, err := item.Str()
			if err != nil {
				return nil, nil, nil, err
			}
			if h == "" || !isDNSName(strings.TrimPrefix(strings.ToLower(h), "*.")) {
				return nil, nil, nil, item.Errorf("%q is not a hostname (a DNS name, optionally starting with *.)", h)
			}
			hosts = append(hosts, strings.ToLower(h))
		}
	}
	return obj, parents, hosts, nil
}

func parseParentRef(n yamltree.Node, ns string) (ParentRef, error) {
	obj, err := n.Object("group", "kind", "namespace", "name", "port", "sectionName")
	if err != nil {
		return ParentRef{}, err
	}
	p := ParentRef{Group: "gateway.networking.k8s.io", Kind: "Gateway", Namespace: ns}
	if gn, ok := obj["group"]; ok {
		if p.Group, err = gn.Str(); err != nil {
			return p, err
		}
	}
	if kn, ok := obj["kind"]; ok {
		if p.Kind, err = kn.Str(); err != nil {
			return p, err
		}
	}
	if p.Name, err = requiredString(n, obj, "name"); err != nil {
		return p, err
	}
	if nn, ok := obj["namespace"]; ok {
		if p.Namespace, err = nn.Str(); err != nil {
			return p, err
		}
	}
	if pn, ok := obj["port"]; ok {
		if p.Port, err = port(pn); err != nil {
			return p, err
		}
	}
	if p.SectionName, err = optionalString(obj, "sectionName"); err != nil {
		return p, err
	}
	return p, nil
}

func (h *HTTPRoute) parseSpec(spec yamltree.Node) error {
	obj, parents, hosts, err := parseCommon(spec, h.Namespace)
	if err != nil {
		return err
	}
	h.ParentRefs, h.Hostnames = parents, hosts
	rn, ok := obj["rules"]
	if !ok || rn.Value == nil {
		// As Gateway API defaults it: one rule matching everything.
		h.Rules = []HTTPRouteRule{{}}
		return nil
	}
	items, err := rn.List()
	if err != nil {
		return err
	}
	for _, item := range items {
		r, err := parseHTTPRule(item, h.Namespace)
		if err != nil {
			return err
		}
		h.Rules = append(h.Rules, r)
	}
	return nil
}

func parseHTTPRule(n yamltree.Node, ns string) (HTTPRouteRule, error) {
	var r HTTPRouteRule
	obj, err := n.Object("name", "matches", "filters", "backendRefs", "timeouts")
	if err != nil {
		return r, err
	}
	if mn, ok := obj["matches"]; ok && mn.Value != nil {
		items, err := mn.List()
		if err != nil {
			return r, err
		}
		for _, item := range items {
			m, err := parseHTTPMatch(item)
			if err != nil {
				return r, err
			}
			r.Matches = append(r.Matches, m)
		}
	}
	if r.Filters, r.Mirrors, err = parseRuleFilters(obj["filters"], ns, false); err != nil {
		return r, err
	}
	if r.BackendRefs, err = parseBackendRefs(obj["backendRefs"], ns, false); err != nil {
		return r, err
	}
	r.Timeouts, err = parseRuleTimeouts(obj["timeouts"])
	return r, err
}

func parseRuleTimeouts(n yamltree.Node) (*policy.Timeouts, error) {
	if n.Value == nil {
		return nil, nil
	}
	obj, err := n.Object("request", "backendRequest")
	if err != nil {
		return nil, err
	}
	t := &policy.Timeouts{}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{{"request", &t.Request}, {"backendRequest", &t.Response}} {
		fn, ok := obj[f.name]
		if !ok {
			continue
		}
		s, err := fn.Str()
		if err != nil {
			return nil, err
		}
		if *f.dst, err = parseGatewayDuration(s); err != nil {
			return nil, fn.Errorf("%v", err)
		}
	}
	return t, nil
}

func parseHTTPMatch(n yamltree.Node) (policy.HTTPRouteMatch, error) {
	var m policy.HTTPRouteMatch
	obj, err := n.Object("path", "headers", "queryParams", "method")
	if err != nil {
		return m, err
	}
	if pn, ok := obj["path"]; ok && pn.Value != nil {
		po, err := pn.Object("type", "value")
		if err != nil {
			return m, err
		}
		typ := "PathPrefix"
		if tn, ok := po["type"]; ok {
			if typ, err = tn.Str(); err != nil {
				return m, err
			}
		}
		value := "/"
		if vn, ok := po["value"]; ok {
			if value, err = vn.Str(); err != nil {
				return m, err
			}
		}
		pm := &policy.PathMatch{Value: value}
		switch typ {
		case "PathPrefix":
			pm.Kind = policy.PathPrefix
		case "Exact":
			pm.Kind = policy.PathExact
		case "RegularExpression":
			pm.Kind = policy.PathRegex
		default:
			return m, po["type"].Errorf("%q is not Exact, PathPrefix or RegularExpression", typ)
		}
		if pm.Kind != policy.PathRegex && !strings.HasPrefix(value, "/") {
			return m, yamltree.Node{Path: pn.Child("value")}.Errorf("%q does not start with /", value)
		}
		if pm.Kind == policy.PathRegex {
			if err := checkRegex(po["value"], value); err != nil {
				return m, err
			}
		}
		m.Path = pm
	}
	if m.Headers, err = parseHeaderMatches(obj["headers"]); err != nil {
		return m, err
	}
	if qn, ok := obj["queryParams"]; ok && qn.Value != nil {
		items, err := qn.List()
		if err != nil {
			return m, err
		}
		for _, item := range items {
			name, value, regex, err := parseValueMatch(item)
			if err != nil {
				return m, err
			}
			m.QueryParams = append(m.QueryParams, policy.QueryParamMatch{Name: name, Value: value, Regex: regex})
		}
	}
	if mn, ok := obj["method"]; ok {
		if m.Method, err = mn.Str(); err != nil {
			return m, err
		}
		switch m.Method {
		case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
			http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch:
		default:
			return m, mn.Errorf("%q is not an HTTP method Gateway API allows", m.Method)
		}
	}
	return m, nil
}

func parseHeaderMatches(n yamltree.Node) ([]policy.HeaderMatch, error) {
	if n.Value == nil {
		return nil, nil
	}
	items, err := n.List()
	if err != nil {
		return nil, err
	}
	var out []policy.HeaderMatch
	for _, item := range items {
		name, value, regex, err := parseValueMatch(item)
		if err != nil {
			return nil, err
		}
		out = append(out, policy.HeaderMatch{Name: name, Value: value, Regex: regex})
	}
	return out, nil
}

// parseValueMatch reads a header or query parameter match.
func parseValueMatch(n yamltree.Node) (name, value string, regex bool, err error) {
	obj, err := n.Object("type", "name", "value")
	if err != nil {
		return "", "", false, err
	}
	if name, err = requiredString(n, obj, "name"); err != nil {
		return "", "", false, err
	}
	vn, ok := obj["value"]
	if !ok {
		return "", "", false, yamltree.Node{Path: n.Child("value")}.Errorf("required")
	}
	if value, err = vn.Str(); err != nil {
		return "", "", false, err
	}
	if tn, ok := obj["type"]; ok {
		typ, err := tn.Str()
		if err != nil {
			return "", "", false, err
		}
		switch typ {
		case "Exact":
		case "RegularExpression":
			regex = true
			if err := checkRegex(vn, value); err != nil {
				return "", "", false, err
			}
		default:
			return "", "", false, tn.Errorf("%q is not Exact or RegularExpression", typ)
		}
	}
	return name, value, regex, nil
}

// checkRegex refuses the value of a RegularExpression match (node n) that
// the proxies would not compile ([policy.CheckRegex]): Linkerd's policy
// controller does not index a route whose regex does not parse, and a
// control plane that served it would have every client refuse the whole
// policy of its parent.
func checkRegex(n yamltree.Node, pattern string) error {
	if err := policy.CheckRegex(pattern); err != nil {
		return n.Errorf("bad regular expression: %v", err)
	}
	return nil
}

// parseFilters reads the filters of a rule or a backendRef: the header
// modifiers and, for HTTP, redirects.
// items, when given, are the filters to read instead of n's.
func parseFilters(n yamltree.Node, grpc bool, items ...yamltree.Node) ([]policy.Filter, error) {
	if n.Value == nil {
		return nil, nil
	}
	if items == nil {
		var err error
		if items, err = n.List(); err != nil {
			return nil, err
		}
	}
	var out []policy.Filter
	for _, item := range items {
		known := []string{"type", "requestHeaderModifier", "responseHeaderModifier", "requestRedirect"}
		if grpc {
			known = []string{"type", "requestHeaderModifier"}
		}
		obj, err := item.Object(known...)
		if err != nil {
			return nil, err
		}
		typ, err := requiredString(item, obj, "type")
		if err != nil {
			return nil, err
		}
		var f policy.Filter
		switch {
		case typ == "RequestHeaderModifier":
			if f.RequestHeaders, err = parseModifier(item, obj, "requestHeaderModifier"); err != nil {
				return nil, err
			}
		case typ == "ResponseHeaderModifier" && !grpc:
			if f.ResponseHeaders, err = parseModifier(item, obj, "responseHeaderModifier"); err != nil {
				return nil, err
			}
		case typ == "RequestRedirect" && !grpc:
			if f.Redirect, err = parseRedirect(item, obj); err != nil {
				return nil, err
			}
		default:
			supported := "RequestHeaderModifier, ResponseHeaderModifier or RequestRedirect"
			if grpc {
				supported = "RequestHeaderModifier"
			}
			return nil, obj["type"].Errorf("filter %q is not supported (supported: %s)", typ, supported)
		}
		out = append(out, f)
	}
	return out, nil
}

func parseModifier(parent yamltree.Node, obj map[string]yamltree.Node, field string) (*policy.HeaderModifier, error) {
	n, ok := obj[field]
	if !ok || n.Value == nil {
		return nil, yamltree.Node{Path: parent.Child(field)}.Errorf("required by type")
	}
	mo, err := n.Object("add", "set", "remove")
	if err != nil {
		return nil, err
	}
	m := &policy.HeaderModifier{}
	for _, f := range []struct {
		name string
		dst  *[]policy.Header
	}{{"add", &m.Add}, {"set", &m.Set}} {
		ln, ok := mo[f.name]
		if !ok || ln.Value == nil {
			continue
		}
		items, err := ln.List()
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			ho, err := item.Object("name", "value")
			if err != nil {
				return nil, err
			}
			name, err := requiredString(item, ho, "name")
			if err != nil {
				return nil, err
			}
			value, err := optionalString(ho, "value")
			if err != nil {
				return nil, err
			}
			*f.dst = append(*f.dst, policy.Header{Name: name, Value: value})
		}
	}
	if rn, ok := mo["remove"]; ok && rn.Value != nil {
		items, err := rn.List()
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			s, err := item.Str()
			if err != nil {
				return nil, err
			}
			m.Remove = append(m.Remove, s)
		}
	}
	return m, nil
}

func parseRedirect(parent yamltree.Node, obj map[string]yamltree.Node) (*policy.Redirect, error) {
	n, ok := obj["requestRedirect"]
	if !ok || n.Value == nil {
		return nil, yamltree.Node{Path: parent.Child("requestRedirect")}.Errorf("required by type")
	}
	ro, err := n.Object("scheme", "hostname", "path", "port", "statusCode")
	if err != nil {
		return nil, err
	}
	r := &policy.Redirect{}
	if r.Scheme, err = optionalString(ro, "scheme"); err != nil {
		return nil, err
	}
	if r.Host, err = optionalString(ro, "hostname"); err != nil {
		return nil, err
	}
	if pn, ok := ro["port"]; ok {
		if r.Port, err = port(pn); err != nil {
			return nil, err
		}
	}
	if sn, ok := ro["statusCode"]; ok {
		code, err := sn.Uint32()
		if err != nil {
			return nil, err
		}
		if code != 301 && code != 302 && code != 303 && code != 307 && code != 308 {
			return nil, sn.Errorf("%d is not a redirect status (301, 302, 303, 307 or 308)", code)
		}
		r.Status = int(code)
	}
	if pn, ok := ro["path"]; ok && pn.Value != nil {
		po, err := pn.Object("type", "replaceFullPath", "replacePrefixMatch")
		if err != nil {
			return nil, err
		}
		typ, err := requiredString(pn, po, "type")
		if err != nil {
			return nil, err
		}
		switch typ {
		case "ReplaceFullPath":
			s, err := optionalString(po, "replaceFullPath")
			if err != nil {
				return nil, err
			}
			r.Path = &policy.PathModifier{Full: s}
		case "ReplacePrefixMatch":
			s, err := optionalString(po, "replacePrefixMatch")
			if err != nil {
				return nil, err
			}
			r.Path = &policy.PathModifier{Full: s, Prefix: true}
		default:
			return nil, po["type"].Errorf("%q is not ReplaceFullPath or ReplacePrefixMatch", typ)
		}
	}
	return r, nil
}

func parseBackendRefs(n yamltree.Node, ns string, grpc bool) ([]BackendRef, error) {
	if n.Value == nil {
		return nil, nil
	}
	items, err := n.List()
	if err != nil {
		return nil, err
	}
	var out []BackendRef
	for _, item := range items {
		obj, err := item.Object("group", "kind", "name", "namespace", "port", "weight", "filters")
		if err != nil {
			return nil, err
		}
		b := BackendRef{Namespace: ns, Weight: 1}
		group, err := optionalString(obj, "group")
		if err != nil {
			return nil, err
		}
		kind, err := optionalString(obj, "kind")
		if err != nil {
			return nil, err
		}
		if (group != "" && group != "core") || (kind != "" && kind != "Service") {
			return nil, item.Errorf("backend %s/%s is not a Service (only Service backends are supported)", group, kind)
		}
		if b.Name, err = requiredString(item, obj, "name"); err != nil {
			return nil, err
		}
		if nn, ok := obj["namespace"]; ok {
			if b.Namespace, err = nn.Str(); err != nil {
				return nil, err
			}
		}
		if pn, ok := obj["port"]; ok {
			if b.Port, err = port(pn); err != nil {
				return nil, err
			}
		}
		if wn, ok := obj["weight"]; ok {
			if b.Weight, err = wn.Uint32(); err != nil {
				return nil, err
			}
			if b.Weight > 1000000 {
				return nil, wn.Errorf("%d is more than 1000000", b.Weight)
			}
		}
		if b.Filters, err = parseFilters(obj["filters"], grpc); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func (g *GRPCRoute) parseSpec(spec yamltree.Node) error {
	obj, parents, hosts, err := parseCommon(spec, g.Namespace)
	if err != nil {
		return err
	}
	g.ParentRefs, g.Hostnames = parents, hosts
	rn, ok := obj["rules"]
	if !ok || rn.Value == nil {
		g.Rules = []GRPCRouteRule{{}}
		return nil
	}
	items, err := rn.List()
	if err != nil {
		return err
	}
	for _, item := range items {
		r, err := parseGRPCRule(item, g.Namespace)
		if err != nil {
			return err
		}
		g.Rules = append(g.Rules, r)
	}
	return nil
}

func parseGRPCRule(n yamltree.Node, ns string) (GRPCRouteRule, error) {
	var r GRPCRouteRule
	obj, err := n.Object("name", "matches", "filters", "backendRefs", "timeouts")
	if err != nil {
		return r, err
	}
	if mn, ok := obj["matches"]; ok && mn.Value != nil {
		items, err := mn.List()
		if err != nil {
			return r, err
		}
		for _, item := range items {
			mo, err := item.Object("method", "headers")
			if err != nil {
				return r, err
			}
			var m policy.GRPCRouteMatch
			if men, ok := mo["method"]; ok && men.Value != nil {
				meo, err := men.Object("type", "service", "method")
				if err != nil {
					return r, err
				}
				if tn, ok := meo["type"]; ok {
					typ, err := tn.Str()
					if err != nil {
						return r, err
					}
					if typ != "Exact" {
						return r, tn.Errorf("%q is not supported (supported: Exact)", typ)
					}
				}
				if m.Service, err = optionalString(meo, "service"); err != nil {
					return r, err
				}
				if m.Method, err = optionalString(meo, "method"); err != nil {
					return r, err
				}
				if m.Service == "" && m.Method == "" {
					return r, men.Errorf("one of service and method is required")
				}
			}
			if m.Headers, err = parseHeaderMatches(mo["headers"]); err != nil {
				return r, err
			}
			r.Matches = append(r.Matches, m)
		}
	}
	if r.Filters, r.Mirrors, err = parseRuleFilters(obj["filters"], ns, true); err != nil {
		return r, err
	}
	if r.BackendRefs, err = parseBackendRefs(obj["backendRefs"], ns, true); err != nil {
		return r, err
	}
	r.Timeouts, err = parseRuleTimeouts(obj["timeouts"])
	return r, err
}

func (b BackendRef) String() string { return fmt.Sprintf("%s/%s:%d", b.Namespace, b.Name, b.Port) }
