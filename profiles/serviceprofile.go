package profiles

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/hedge"
	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/recache"
	"github.com/inmesh/inmesh/internal/yamltree"
	"golang.org/x/net/http/httpguts"
)

// ServiceProfile is one ServiceProfile resource (apiVersion
// linkerd.io/v1alpha2) as read from YAML. It describes a service name on
// every port; [ServiceProfile.ProfileFor] gives the [Profile] of one port.
type ServiceProfile struct {
	// Name is metadata.name: the fully qualified service name, such as
	// books.default.svc.cluster.local.
	Name string
	// Namespace is metadata.namespace, if set.
	Namespace string
	// Routes are spec.routes, in order.
	Routes []Route
	// RetryBudget is spec.retryBudget, or [DefaultRetryBudget] when the
	// resource sets none.
	RetryBudget RetryBudget
	// DstOverrides are spec.dstOverrides; an authority without a port gets
	// the port of the request.
	DstOverrides []endpoint.WeightedDst
	// OpaquePorts are spec.opaquePorts, sorted.
	OpaquePorts []uint32
	// Annotations are metadata.annotations; the hedge.inmesh.io ones set
	// the Hedge of the routes (see [hedge.FromAnnotations] and
	// [hedge.AnnotationRoutes]).
	Annotations map[string]string
}

// EffectiveNamespace is the namespace the profile is in, as a control
// plane keys it: Namespace, or, when that is not set, the namespace its
// name gives (name.NAMESPACE.svc...). A profile in its Service's
// namespace serves every client; one in another namespace serves the
// clients of that namespace.
func (sp *ServiceProfile) EffectiveNamespace() string {
	if sp.Namespace != "" {
		return sp.Namespace
	}
	return NamespaceOfName(sp.Name)
}

// NamespaceOfName is the namespace a ServiceProfile's name gives
// (name.NAMESPACE.svc...), "" for a name of one label.
func NamespaceOfName(name string) string {
	if labels := strings.Split(strings.ToLower(name), "."); len(labels) > 1 {
		return labels[1]
	}
	return ""
}

// ProfileFor returns the profile that a control plane serves for
// Name:port. The result shares the routes of sp and must not be modified.
func (sp *ServiceProfile) ProfileFor(port uint32) *Profile {
	budget := sp.RetryBudget
	p := &Profile{
		FullyQualifiedName: sp.Name,
		Routes:             sp.Routes,
		RetryBudget:        &budget,
	}
	for _, o := range sp.DstOverrides {
		if _, _, err := net.SplitHostPort(o.Authority); err != nil {
			o.Authority = net.JoinHostPort(o.Authority, strconv.FormatUint(uint64(port), 10))
		}
		p.DstOverrides = append(p.DstOverrides, o)
	}
	i := sort.Search(len(sp.OpaquePorts), func(i int) bool { return sp.OpaquePorts[i] >= port })
	p.OpaqueProtocol = i < len(sp.OpaquePorts) && sp.OpaquePorts[i] == port
	return p
}

// Limits applied when reading profiles: control-plane input is not trusted
// to be small.
const (
	MaxPathRegexLen = 1024 // bytes of one path regex
	MaxRoutes       = 256  // routes of one profile
	MaxMatchDepth   = 32   // nesting of all/any/not
)

// ParseServiceProfiles reads every ServiceProfile document of a YAML stream
// (documents separated by --- lines). Empty documents are skipped. An error
// names the document (counting from 1) and the field path, as in
// "document 2: spec.routes[0].timeout: "3x" is not a duration"; no profile
// is returned with it.
func ParseServiceProfiles(data []byte) ([]*ServiceProfile, error) {
	var out []*ServiceProfile
	for i, doc := range yamltree.SplitDocuments(data) {
		if yamltree.Blank(doc) {
			continue
		}
		sp, err := parseServiceProfile(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		out = append(out, sp)
	}
	return out, nil
}

// ErrFileChanged is wrapped by the error of [LoadServiceProfileFiles] when a
// file changed while it was read (its size or modification time differed
// before and after): it is still being written and is read again later.
var ErrFileChanged = filestamp.ErrChanged

// LoadServiceProfileFiles reads the ServiceProfiles of each file; errors
// name the file. Two profiles with one name are an error, and so is a file
// with no ServiceProfile (empty, only comments, or truncated to nothing):
// remove a file to remove its profiles. A file that changed while it was
// read gives an error wrapping [ErrFileChanged]; read it again later.
func LoadServiceProfileFiles(paths ...string) ([]*ServiceProfile, error) {
	var out []*ServiceProfile
	seen := make(map[string]string)
	for _, path := range paths {
		data, err := filestamp.Read(path)
		if err != nil {
			return nil, err
		}
		sps, err := ParseServiceProfiles(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(sps) == 0 {
			return nil, fmt.Errorf("%s: no ServiceProfile in the file (empty, or truncated?); remove the file to remove its profiles", path)
		}
		for _, sp := range sps {
			if prev, dup := seen[sp.Name]; dup {
				return nil, fmt.Errorf("%s: ServiceProfile %s is also defined in %s", path, sp.Name, prev)
			}
			seen[sp.Name] = path
		}
		out = append(out, sps...)
	}
	return out, nil
}

// ParseServiceProfile reads one YAML document holding a ServiceProfile;
// the error names the field, as in "spec.routes[0].timeout: ...".
func ParseServiceProfile(doc []byte) (*ServiceProfile, error) { return parseServiceProfile(doc) }

func parseServiceProfile(doc []byte) (*ServiceProfile, error) {
	doc0, err := yamltree.Decode(doc)
	if err != nil {
		return nil, err
	}
	root, err := doc0.Object("apiVersion", "kind", "metadata", "spec")
	if err != nil {
		return nil, err
	}
	if err := expectString(root, "apiVersion", "linkerd.io/v1alpha2"); err != nil {
		return nil, err
	}
	if err := expectString(root, "kind", "ServiceProfile"); err != nil {
		return nil, err
	}
	sp := &ServiceProfile{RetryBudget: DefaultRetryBudget()}
	meta, ok := root["metadata"]
	if !ok {
		return nil, errors.New("metadata.name: required")
	}
	if err := sp.parseMetadata(meta); err != nil {
		return nil, err
	}
	specNode, ok := root["spec"]
	if !ok {
		return nil, errors.New("spec: required")
	}
	if err := sp.parseSpec(specNode); err != nil {
		return nil, err
	}
	if err := sp.applyHedging(); err != nil {
		return nil, err
	}
	return sp, nil
}

// applyHedging sets the Hedge of the routes from the hedge.inmesh.io
// annotations: every route, or those hedge.inmesh.io/routes names (each
// must be a route of the profile).
func (sp *ServiceProfile) applyHedging() error {
	p, err := hedge.FromAnnotations(sp.Annotations)
	if err != nil {
		return err
	}
	v, hasRoutes := sp.Annotations[hedge.AnnotationRoutes]
	if p == nil {
		if hasRoutes {
			return hedge.AnnotationError(hedge.AnnotationRoutes, "needs %s", hedge.AnnotationDelay)
		}
		return nil
	}
	if !hasRoutes {
		for i := range sp.Routes {
			sp.Routes[i].Hedge = p
		}
		return nil
	}
	names, err := hedge.RouteNames(v)
	if err != nil {
		return err
	}
	for _, name := range names {
		found := false
		for i := range sp.Routes {
			if sp.Routes[i].Labels["route"] == name {
				sp.Routes[i].Hedge = p
				found = true
			}
		}
		if !found {
			known := make([]string, 0, len(sp.Routes))
			for _, r := range sp.Routes {
				known = append(known, strconv.Quote(r.Labels["route"]))
			}
			return hedge.AnnotationError(hedge.AnnotationRoutes, "%q is not the name of a route of spec.routes (%s)", name, strings.Join(known, ", "))
		}
	}
	return nil
}

func expectString(obj map[string]yamltree.Node, field, want string) error {
	n, ok := obj[field]
	if !ok {
		return fmt.Errorf("%s: required (%s)", field, want)
	}
	s, err := n.Str()
	if err != nil {
		return err
	}
	if s != want {
		return n.Errorf("%q is not supported (want %s)", s, want)
	}
	return nil
}

func (sp *ServiceProfile) parseMetadata(n yamltree.Node) error {
	meta, err := n.Object("name", "namespace", "labels", "annotations", "uid", "resourceVersion",
		"generation", "creationTimestamp", "managedFields", "selfLink", "ownerReferences")
	if err != nil {
		return err
	}
	name, ok := meta["name"]
	if !ok {
		return n.Errorf("name: required")
	}
	if sp.Name, err = name.Str(); err != nil {
		return err
	}
	sp.Name = strings.TrimSuffix(sp.Name, ".")
	if !authority.ValidDNSName(sp.Name) {
		return name.Errorf("%q is not a fully qualified service name", sp.Name)
	}
	if ns, ok := meta["namespace"]; ok {
		if sp.Namespace, err = ns.Str(); err != nil {
			return err
		}
	}
	if an, ok := meta["annotations"]; ok && an.Value != nil {
		m, ok := an.Value.(map[string]any)
		if !ok {
			return an.Errorf("must be an object of strings")
		}
		sp.Annotations = make(map[string]string, len(m))
		for _, k := range yamltree.SortedKeys(m) {
			v, err := yamltree.Node{Path: an.Child(k), Value: m[k]}.Scalar()
			if err != nil {
				return err
			}
			sp.Annotations[k] = v
		}
	}
	return nil
}

func (sp *ServiceProfile) parseSpec(n yamltree.Node) error {
	spec, err := n.Object("routes", "retryBudget", "dstOverrides", "opaquePorts")
	if err != nil {
		return err
	}
	if rn, ok := spec["routes"]; ok && rn.Value != nil {
		routes, err := rn.List()
		if err != nil {
			return err
		}
		if len(routes) > MaxRoutes {
			return rn.Errorf("%d routes is more than the limit of %d", len(routes), MaxRoutes)
		}
		for _, r := range routes {
			route, err := parseRoute(r)
			if err != nil {
				return err
			}
			sp.Routes = append(sp.Routes, route)
		}
	}
	if bn, ok := spec["retryBudget"]; ok && bn.Value != nil {
		if sp.RetryBudget, err = parseRetryBudget(bn); err != nil {
			return err
		}
	}
	if dn, ok := spec["dstOverrides"]; ok && dn.Value != nil {
		dsts, err := dn.List()
		if err != nil {
			return err
		}
		for _, d := range dsts {
			dst, err := parseWeightedDst(d)
			if err != nil {
				return err
			}
			sp.DstOverrides = append(sp.DstOverrides, dst)
		}
	}
	if on, ok := spec["opaquePorts"]; ok && on.Value != nil {
		if sp.OpaquePorts, err = parseOpaquePorts(on); err != nil {
			return err
		}
	}
	return nil
}

func parseRoute(n yamltree.Node) (Route, error) {
	obj, err := n.Object("name", "condition", "responseClasses", "isRetryable", "timeout")
	if err != nil {
		return Route{}, err
	}
	var r Route
	nameNode, ok := obj["name"]
	if !ok {
		return r, n.Errorf("name: required")
	}
	name, err := nameNode.Str()
	if err != nil {
		return r, err
	}
	if strings.TrimSpace(name) == "" {
		return r, nameNode.Errorf("must not be empty")
	}
	r.Labels = map[string]string{"route": name}
	cond, ok := obj["condition"]
	if !ok || cond.Value == nil {
		return r, yamltree.Node{Path: n.Child("condition")}.Errorf("required")
	}
	if r.Condition, err = parseRequestMatch(cond, 0); err != nil {
		return r, err
	}
	if cn, ok := obj["responseClasses"]; ok && cn.Value != nil {
		classes, err := cn.List()
		if err != nil {
			return r, err
		}
		for _, c := range classes {
			rc, err := parseResponseClass(c)
			if err != nil {
				return r, err
			}
			r.ResponseClasses = append(r.ResponseClasses, rc)
		}
	}
	if rn, ok := obj["isRetryable"]; ok {
		if r.Retryable, err = rn.Bool(); err != nil {
			return r, err
		}
	}
	if tn, ok := obj["timeout"]; ok && tn.Value != nil {
		if r.Timeout, err = tn.Duration(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// parseRequestMatch reads a request condition. Like Linkerd's control
// plane, several fields in one condition all have to match, in the order
// all, any, method, not, pathRegex.
func parseRequestMatch(n yamltree.Node, depth int) (RequestMatch, error) {
	if depth > MaxMatchDepth {
		return nil, n.Errorf("nested deeper than %d", MaxMatchDepth)
	}
	obj, err := n.Object("all", "any", "method", "not", "pathRegex")
	if err != nil {
		return nil, err
	}
	var parts []RequestMatch
	if sn, ok := obj["all"]; ok {
		seq, err := parseSeq(sn, depth, parseRequestMatch)
		if err != nil {
			return nil, err
		}
		parts = append(parts, MatchAll(seq))
	}
	if sn, ok := obj["any"]; ok {
		seq, err := parseSeq(sn, depth, parseRequestMatch)
		if err != nil {
			return nil, err
		}
		parts = append(parts, MatchAny(seq))
	}
	if mn, ok := obj["method"]; ok {
		m, err := mn.Str()
		if err != nil {
			return nil, err
		}
		if !httpguts.ValidHeaderFieldName(m) {
			return nil, mn.Errorf("%q is not an HTTP method", m)
		}
		// Upper-cased as Linkerd's controller does: method: delete
		// matches a DELETE request.
		parts = append(parts, Method(strings.ToUpper(m)))
	}
	if nn, ok := obj["not"]; ok {
		m, err := parseRequestMatch(nn, depth+1)
		if err != nil {
			return nil, err
		}
		parts = append(parts, MatchNot{m})
	}
	if pn, ok := obj["pathRegex"]; ok {
		re, err := pn.Str()
		if err != nil {
			return nil, err
		}
		if err := checkPathRegex(re); err != nil {
			return nil, pn.Errorf("%v", err)
		}
		parts = append(parts, PathRegex(re))
	}
	switch len(parts) {
	case 0:
		return nil, n.Errorf("no condition set (one of all, any, method, not, pathRegex)")
	case 1:
		return parts[0], nil
	}
	return MatchAll(parts), nil
}

// parseSeq reads the list of conditions of an all or any.
func parseSeq[M any](n yamltree.Node, depth int, parse func(yamltree.Node, int) (M, error)) ([]M, error) {
	items, err := n.List()
	if err != nil {
		return nil, err
	}
	seq := make([]M, 0, len(items))
	for _, item := range items {
		m, err := parse(item, depth+1)
		if err != nil {
			return nil, err
		}
		seq = append(seq, m)
	}
	return seq, nil
}

func parseResponseClass(n yamltree.Node) (ResponseClass, error) {
	obj, err := n.Object("condition", "isFailure")
	if err != nil {
		return ResponseClass{}, err
	}
	var rc ResponseClass
	cond, ok := obj["condition"]
	if !ok || cond.Value == nil {
		return rc, yamltree.Node{Path: n.Child("condition")}.Errorf("required")
	}
	if rc.Condition, err = parseResponseMatch(cond, 0); err != nil {
		return rc, err
	}
	if fn, ok := obj["isFailure"]; ok {
		if rc.IsFailure, err = fn.Bool(); err != nil {
			return rc, err
		}
	}
	return rc, nil
}

func parseResponseMatch(n yamltree.Node, depth int) (ResponseMatch, error) {
	if depth > MaxMatchDepth {
		return nil, n.Errorf("nested deeper than %d", MaxMatchDepth)
	}
	obj, err := n.Object("all", "any", "not", "status")
	if err != nil {
		return nil, err
	}
	var parts []ResponseMatch
	if sn, ok := obj["all"]; ok {
		seq, err := parseSeq(sn, depth, parseResponseMatch)
		if err != nil {
			return nil, err
		}
		parts = append(parts, ResponseAll(seq))
	}
	if sn, ok := obj["any"]; ok {
		seq, err := parseSeq(sn, depth, parseResponseMatch)
		if err != nil {
			return nil, err
		}
		parts = append(parts, ResponseAny(seq))
	}
	if nn, ok := obj["not"]; ok {
		m, err := parseResponseMatch(nn, depth+1)
		if err != nil {
			return nil, err
		}
		parts = append(parts, ResponseNot{m})
	}
	if sn, ok := obj["status"]; ok {
		st, err := sn.Object("min", "max")
		if err != nil {
			return nil, err
		}
		var r StatusRange
		if v, ok := st["min"]; ok {
			if r.Min, err = v.Uint32(); err != nil {
				return nil, err
			}
		}
		if v, ok := st["max"]; ok {
			if r.Max, err = v.Uint32(); err != nil {
				return nil, err
			}
		}
		if err := r.check(); err != nil {
			return nil, sn.Errorf("%v", err)
		}
		parts = append(parts, r)
	}
	switch len(parts) {
	case 0:
		return nil, n.Errorf("no condition set (one of all, any, not, status)")
	case 1:
		return parts[0], nil
	}
	return ResponseAll(parts), nil
}

func parseRetryBudget(n yamltree.Node) (RetryBudget, error) {
	obj, err := n.Object("retryRatio", "minRetriesPerSecond", "ttl")
	if err != nil {
		return RetryBudget{}, err
	}
	var b RetryBudget
	for _, f := range []string{"retryRatio", "minRetriesPerSecond", "ttl"} {
		if _, ok := obj[f]; !ok {
			return b, yamltree.Node{Path: n.Child(f)}.Errorf("required")
		}
	}
	if b.RetryRatio, err = obj["retryRatio"].Float32(); err != nil {
		return b, err
	}
	if b.MinRetriesPerSecond, err = obj["minRetriesPerSecond"].Uint32(); err != nil {
		return b, err
	}
	if b.TTL, err = obj["ttl"].Duration(); err != nil {
		return b, err
	}
	if err := b.Validate(); err != nil {
		var fe *budgetFieldError
		if errors.As(err, &fe) {
			return b, obj[fe.field].Errorf("%s", fe.msg)
		}
		return b, n.Errorf("%v", err)
	}
	return b, nil
}

func parseWeightedDst(n yamltree.Node) (endpoint.WeightedDst, error) {
	obj, err := n.Object("authority", "weight")
	if err != nil {
		return endpoint.WeightedDst{}, err
	}
	var d endpoint.WeightedDst
	an, ok := obj["authority"]
	if !ok {
		return d, yamltree.Node{Path: n.Child("authority")}.Errorf("required")
	}
	if d.Authority, err = an.Str(); err != nil {
		return d, err
	}
	host := d.Authority
	if h, port, err := net.SplitHostPort(d.Authority); err == nil {
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return d, an.Errorf("%q has a bad port", d.Authority)
		}
		host = h
	}
	if !authority.ValidDNSName(strings.TrimSuffix(host, ".")) {
		return d, an.Errorf("%q is not a host name", d.Authority)
	}
	wn, ok := obj["weight"]
	if !ok {
		return d, yamltree.Node{Path: n.Child("weight")}.Errorf("required")
	}
	q, err := wn.Scalar()
	if err != nil {
		return d, err
	}
	if d.Weight, err = parseWeight(q); err != nil {
		return d, wn.Errorf("%v", err)
	}
	return d, nil
}

// parseOpaquePorts accepts a list of ports or an object whose keys are
// ports (the CRD's set form).
func parseOpaquePorts(n yamltree.Node) ([]uint32, error) {
	var items []yamltree.Node
	if m, ok := n.Value.(map[string]any); ok {
		for _, k := range yamltree.SortedKeys(m) {
			items = append(items, yamltree.Node{Path: n.Child(k), Value: json.Number(k)})
		}
	} else {
		var err error
		if items, err = n.List(); err != nil {
			return nil, err
		}
	}
	var ports []uint32
	for _, item := range items {
		s, err := item.Scalar()
		if err != nil {
			return nil, err
		}
		p, err := strconv.ParseUint(s, 10, 16)
		if err != nil || p == 0 {
			return nil, item.Errorf("%q is not a port", s)
		}
		ports = append(ports, uint32(p))
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	return ports, nil
}

// budgetFieldError is a RetryBudget validation failure of one field.
type budgetFieldError struct{ field, msg string }

func (e *budgetFieldError) Error() string { return "retry budget " + e.field + ": " + e.msg }

// Validate reports whether Linkerd's proxy would accept the budget: the
// ratio in [0, 1000], at most 2³¹-1 minimum retries per second, and a TTL
// from 1s to 60s. A proxy disables retries for a profile whose budget is
// invalid.
func (b RetryBudget) Validate() error {
	switch {
	case !(b.RetryRatio >= 0 && b.RetryRatio <= 1000):
		return &budgetFieldError{"retryRatio", fmt.Sprintf("%v is outside [0, 1000]", b.RetryRatio)}
	case b.MinRetriesPerSecond > 1<<31-1:
		return &budgetFieldError{"minRetriesPerSecond", fmt.Sprintf("%d is more than %d", b.MinRetriesPerSecond, 1<<31-1)}
	case b.TTL < time.Second || b.TTL > time.Minute:
		return &budgetFieldError{"ttl", fmt.Sprintf("%v is outside [1s, 60s]", b.TTL)}
	}
	return nil
}

// check reports whether a ServiceProfile file may say r: [StatusRange.convertible],
// and not reversed.
func (r StatusRange) check() error {
	if err := r.convertible(); err != nil {
		return err
	}
	if lo, hi := r.bounds(); lo > hi {
		return fmt.Errorf("min %d is greater than max %d", lo, hi)
	}
	return nil
}

// convertible reports whether r has a status code (100-999) for each
// bound, a zero bound standing for the other, as Linkerd's proxy needs to
// convert it; a reversed range converts, and matches nothing.
func (r StatusRange) convertible() error {
	lo, hi := r.bounds()
	switch {
	case r.Min == 0 && r.Max == 0:
		return errors.New("min and max are both unset")
	case lo < 100 || lo > 999 || hi < 100 || hi > 999:
		return fmt.Errorf("range %d-%d is outside the status codes 100-999", lo, hi)
	}
	return nil
}

// bounds returns the inclusive range, a zero bound standing for the other.
func (r StatusRange) bounds() (lo, hi uint32) {
	lo, hi = r.Min, r.Max
	if lo == 0 {
		lo = hi
	}
	if hi == 0 {
		hi = lo
	}
	return lo, hi
}

func checkPathRegex(pattern string) error {
	if len(pattern) > MaxPathRegexLen {
		return fmt.Errorf("regex of %d bytes is longer than the limit of %d", len(pattern), MaxPathRegexLen)
	}
	if _, err := recache.CompileAnchored(pattern); err != nil {
		return fmt.Errorf("bad regex: %v", err)
	}
	return nil
}

// NameProblem returns an error when sp's name cannot be the authority of a
// request, so that the profile would never apply: a name of one label
// ("stock"), or a Kubernetes service name that is cut short or misplaced
// ("stock.default.svc", "stock.svc.cluster.local": the service and the
// namespace are the two labels before "svc", and the cluster domain
// follows). Requests are routed by their authority's fully qualified name,
// such as stock.default.svc.cluster.local; nil means the name is usable
// (two-label names are left alone: they may be external domains).
func (sp *ServiceProfile) NameProblem() error {
	labels := strings.Split(sp.Name, ".")
	svc := slices.Index(labels, "svc")
	if len(labels) < 2 || svc >= 0 && (svc != 2 || svc == len(labels)-1) {
		return fmt.Errorf("metadata.name %q is not a fully qualified service name (such as %s.default.svc.cluster.local): requests are routed by their authority's full name, so this profile matches none", sp.Name, labels[0])
	}
	return nil
}
