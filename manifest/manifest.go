// Package manifest reads the Kubernetes-style YAML that inmesh's embedded
// control plane serves from: Service manifests (their ports and the
// retry.linkerd.io and timeout.linkerd.io annotations), Gateway API
// HTTPRoute and GRPCRoute resources (gateway.networking.k8s.io/v1 and
// Linkerd's policy.linkerd.io/v1beta3 copies) whose parentRefs name a
// Service, and ServiceProfiles, side by side in any file, as users keep a
// service's resources. [Resources.Policy] turns them into the outbound policy of one
// Service port, as Linkerd's policy controller does. Pods, Servers,
// AuthorizationPolicies, MeshTLSAuthentications, NetworkAuthentications,
// HTTPLocalRateLimitPolicies and the HTTPRoutes whose parentRefs name a
// Server make the inbound policy of a pod port, [Resources.InboundServer]
// (a [github.com/inmesh/inmesh/authz.Server]). [ParseEndpoints]
// reads the endpoints file of the embedded Destination API.
// [ProfileSource] watches a directory of ServiceProfile files and streams
// their profiles to a router that has no control plane.
//
// Every error names the file, the document (counted from 1) and the field,
// as in "routes.yaml: document 2 (HTTPRoute default/authors): spec.rules[0].matches[1].path.type: ...".
package manifest

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/internal/filestamp"
	"github.com/inmesh/inmesh/internal/yamltree"
	"github.com/inmesh/inmesh/profiles"
)

// Resources is what a set of manifest files holds. Load and Parse return
// it sorted (namespace, then name), which is the order routes of equal
// precedence are tried in. Its lookups are safe for concurrent use. It
// may be changed by assigning or appending to its slices, not by changing
// the resources they hold once it has been looked up, and must not be
// copied.
type Resources struct {
	Services   []*Service
	HTTPRoutes []*HTTPRoute
	GRPCRoutes []*GRPCRoute
	// ServiceProfiles are the linkerd.io/v1alpha2 ServiceProfiles, which
	// the Destination API serves; a directory of manifests may hold them
	// beside the Services and routes, as users keep a service's resources.
	ServiceProfiles []*profiles.ServiceProfile

	// The inbound kinds, which [Resources.InboundServer] reads.
	Pods                       []*Pod
	Servers                    []*Server
	AuthorizationPolicies      []*AuthorizationPolicy
	MeshTLSAuthentications     []*MeshTLSAuthentication
	NetworkAuthentications     []*NetworkAuthentication
	HTTPLocalRateLimitPolicies []*HTTPLocalRateLimitPolicy

	profileObjects []*Object // for the duplicate check across files

	// idx is what the lookups read (index.go): change a Resources by
	// replacing its slices, not their elements, once it was looked up.
	idx atomic.Pointer[index]
}

// Object identifies a resource.
type Object struct {
	// Group is the API group ("" for core), Kind its kind.
	Group, Kind     string
	Namespace, Name string
	Annotations     map[string]string
	// Labels are metadata.labels, which Server podSelectors match.
	Labels map[string]string
	// Created is metadata.creationTimestamp (zero when absent): among
	// routes whose matches tie, the oldest wins, as in Linkerd and the
	// Gateway API.
	Created time.Time

	// file and doc say where the object was defined (doc counted from 1;
	// file empty when it came from [Parse]), for [Resources.Problems].
	file string
	doc  int
}

// where names the object's file, document and kind/name, as errors do.
func (o *Object) where() string {
	s := fmt.Sprintf("document %d (%s %s)", o.doc, o.Kind, o.key())
	if o.file != "" {
		s = o.file + ": " + s
	}
	return s
}

func (o *Object) key() string {
	if o.Namespace == "" {
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}

// Load reads the manifest files at paths. It fails, naming the file, the
// document and the field, when any document is bad (duplicate keys
// included), a file is empty, or a resource is defined twice; then nothing
// is returned. A file that changed while it was read is an error wrapping
// filestamp's ErrChanged (the same as profiles.ErrFileChanged).
func Load(paths ...string) (*Resources, error) {
	files := make([]File, 0, len(paths))
	for _, path := range paths {
		data, err := filestamp.Read(path)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: path, Data: data})
	}
	return LoadFiles(files...)
}

// File is the content of one manifest file and the name its errors give
// it: a path, or the key of a store that holds files' bytes.
type File struct {
	Name string
	Data []byte
}

// LoadFiles reads manifest files already in memory, with the rules and
// errors of [Load], each error naming the file by its Name.
func LoadFiles(files ...File) (*Resources, error) {
	out := &Resources{}
	seen := make(map[string]string)
	for _, f := range files {
		path, data := f.Name, f.Data
		if yamltree.Blank(data) {
			// As the other loaders: an empty file is more likely a copy
			// caught half-way than a wish to remove everything.
			return nil, fmt.Errorf("%s: empty file (no documents)", path)
		}
		r, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, o := range r.objects() {
			o.file = path
			k := o.Kind + " " + o.key()
			if prev, dup := seen[k]; dup {
				return nil, fmt.Errorf("%s: %s is also defined in %s", path, k, prev)
			}
			seen[k] = path
		}
		out.Services = append(out.Services, r.Services...)
		out.HTTPRoutes = append(out.HTTPRoutes, r.HTTPRoutes...)
		out.GRPCRoutes = append(out.GRPCRoutes, r.GRPCRoutes...)
		out.ServiceProfiles = append(out.ServiceProfiles, r.ServiceProfiles...)
		out.appendInbound(r)
		out.profileObjects = append(out.profileObjects, r.profileObjects...)
	}
	out.sort()
	out.index() // now, rather than on the first lookup
	return out, nil
}

func (r *Resources) objects() []*Object {
	var out []*Object
	for _, s := range r.Services {
		out = append(out, &s.Object)
	}
	for _, h := range r.HTTPRoutes {
		out = append(out, &h.Object)
	}
	for _, g := range r.GRPCRoutes {
		out = append(out, &g.Object)
	}
	out = append(out, r.inboundObjects()...)
	return append(out, r.profileObjects...)
}

func (r *Resources) sort() {
	slices.SortStableFunc(r.Services, func(a, b *Service) int { return strings.Compare(a.key(), b.key()) })
	slices.SortStableFunc(r.HTTPRoutes, func(a, b *HTTPRoute) int { return strings.Compare(a.key(), b.key()) })
	slices.SortStableFunc(r.GRPCRoutes, func(a, b *GRPCRoute) int { return strings.Compare(a.key(), b.key()) })
	slices.SortStableFunc(r.ServiceProfiles, func(a, b *profiles.ServiceProfile) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.EffectiveNamespace(), b.EffectiveNamespace())
	})
	r.sortInbound()
}

// Parse reads a YAML stream of Service, HTTPRoute and GRPCRoute documents.
// Errors name the document and the field.
func Parse(data []byte) (*Resources, error) {
	out := &Resources{}
	seen := make(map[string]int)
	for i, doc := range yamltree.SplitDocuments(data) {
		if yamltree.Blank(doc) {
			continue
		}
		obj, err := parseDocument(doc, i+1, out)
		if err != nil {
			if obj != nil && obj.Name != "" {
				return nil, fmt.Errorf("document %d (%s %s): %w", i+1, obj.Kind, obj.key(), err)
			}
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if obj == nil {
			continue
		}
		k := obj.Kind + " " + obj.key()
		if prev, dup := seen[k]; dup {
			return nil, fmt.Errorf("document %d: %s is also defined in document %d", i+1, k, prev)
		}
		seen[k] = i + 1
	}
	out.sort()
	return out, nil
}

// The API versions read.
const (
	gatewayV1              = "gateway.networking.k8s.io/v1"
	linkerdV1beta3         = "policy.linkerd.io/v1beta3"
	serviceProfileV1alpha2 = "linkerd.io/v1alpha2"
)

// kindVersions are the API versions read of each kind, so that a known
// kind of another version is named by its apiVersion field.
var kindVersions = map[string][]string{
	"Service":                  {"v1"},
	"Pod":                      {"v1"},
	"HTTPRoute":                {gatewayV1, linkerdV1beta3},
	"GRPCRoute":                {gatewayV1, linkerdV1beta3},
	"ServiceProfile":           {serviceProfileV1alpha2},
	"Server":                   {linkerdV1beta3, "policy.linkerd.io/v1beta2", "policy.linkerd.io/v1beta1"},
	"AuthorizationPolicy":      {linkerdV1alpha1},
	"MeshTLSAuthentication":    {linkerdV1alpha1},
	"NetworkAuthentication":    {linkerdV1alpha1},
	"HTTPLocalRateLimitPolicy": {linkerdV1alpha1},
}

// topFields are the fields a document may have; status (as kubectl get
// prints it) is ignored.
var topFields = []string{"apiVersion", "kind", "metadata", "spec", "status"}

// metadataFields are the fields of metadata; only name, namespace,
// annotations and creationTimestamp are used.
var metadataFields = []string{"name", "namespace", "annotations", "labels", "uid", "resourceVersion",
	"generation", "creationTimestamp", "managedFields", "ownerReferences", "finalizers", "generateName"}

func parseDocument(doc []byte, index int, out *Resources) (*Object, error) {
	root, err := yamltree.Decode(doc)
	if err != nil {
		return nil, err
	}
	if root.Value == nil {
		return nil, nil
	}
	top, err := root.Object(topFields...)
	if err != nil {
		return nil, err
	}
	apiVersion, err := requiredString(root, top, "apiVersion")
	if err != nil {
		return nil, err
	}
	kind, err := requiredString(root, top, "kind")
	if err != nil {
		return nil, err
	}
	obj := &Object{Kind: kind, doc: index}
	if err := obj.parseMetadata(root, top); err != nil {
		return obj, err
	}
	spec := top["spec"]
	if spec.Path == "" {
		spec = yamltree.Node{Path: "spec", Value: map[string]any{}}
	}
	switch {
	case kind == "Service" && apiVersion == "v1":
		s := &Service{Object: *obj}
		if err := s.parseSpec(spec); err != nil {
			return obj, err
		}
		if err := s.checkOpaquePortNames(); err != nil {
			return obj, err
		}
		out.Services = append(out.Services, s)
	case kind == "HTTPRoute" && (apiVersion == gatewayV1 || apiVersion == linkerdV1beta3):
		obj.Group = strings.Split(apiVersion, "/")[0]
		h := &HTTPRoute{Object: *obj}
		if err := h.parseSpec(spec); err != nil {
			return obj, err
		}
		out.HTTPRoutes = append(out.HTTPRoutes, h)
	case kind == "GRPCRoute" && (apiVersion == gatewayV1 || apiVersion == linkerdV1beta3):
		obj.Group = strings.Split(apiVersion, "/")[0]
		g := &GRPCRoute{Object: *obj}
		if err := g.parseSpec(spec); err != nil {
			return obj, err
		}
		out.GRPCRoutes = append(out.GRPCRoutes, g)
	case kind == "ServiceProfile" && apiVersion == serviceProfileV1alpha2:
		obj.Group, obj.Namespace = "linkerd.io", "" // named by its fully qualified name in errors
		sp, err := profiles.ParseServiceProfile(doc)
		if err != nil {
			return obj, err
		}
		// Known by its fully qualified name in its namespace: one in a
		// client's namespace and one in the Service's are two profiles.
		obj.Namespace = sp.EffectiveNamespace()
		out.ServiceProfiles = append(out.ServiceProfiles, sp)
		out.profileObjects = append(out.profileObjects, obj)
		return obj, nil
	default:
		known, err := parseInbound(apiVersion, kind, obj, spec, out)
		if err != nil {
			return obj, err
		}
		if versions, ok := kindVersions[kind]; !known && ok {
			return obj, top["apiVersion"].Errorf("%q is not an API version of %s read here (want %s)", apiVersion, kind, strings.Join(versions, " or "))
		}
		if !known {
			return obj, top["kind"].Errorf("%s %s is not read here (known: v1 Service and Pod; HTTPRoute and GRPCRoute of %s or %s; %s ServiceProfile; %s)",
				apiVersion, kind, gatewayV1, linkerdV1beta3, serviceProfileV1alpha2, inboundKinds)
		}
	}
	if err := checkAnnotations(obj.Annotations); err != nil {
		return obj, err
	}
	return obj, nil
}

func (o *Object) parseMetadata(root yamltree.Node, top map[string]yamltree.Node) error {
	mn, ok := top["metadata"]
	if !ok {
		return yamltree.Node{Path: root.Child("metadata")}.Errorf("required")
	}
	md, err := mn.Object(metadataFields...)
	if err != nil {
		return err
	}
	if o.Name, err = requiredString(mn, md, "name"); err != nil {
		return err
	}
	if !isDNSName(o.Name) {
		return md["name"].Errorf("%q is not a DNS name (lower case letters, digits, '-' and '.')", o.Name)
	}
	o.Namespace = "default"
	if nn, ok := md["namespace"]; ok {
		if o.Namespace, err = nn.Str(); err != nil {
			return err
		}
		if !isDNSLabel(o.Namespace) {
			return nn.Errorf("%q is not a DNS label (lower case letters, digits and '-')", o.Namespace)
		}
	}
	if cn, ok := md["creationTimestamp"]; ok && cn.Value != nil {
		v, err := cn.Str()
		if err != nil {
			return err
		}
		if o.Created, err = time.Parse(time.RFC3339, v); err != nil {
			return cn.Errorf("%q is not an RFC 3339 time (such as 2024-01-02T15:04:05Z)", v)
		}
	}
	if ln, ok := md["labels"]; ok && ln.Value != nil {
		if o.Labels, err = stringMap(ln); err != nil {
			return err
		}
	}
	if an, ok := md["annotations"]; ok && an.Value != nil {
		m, ok := an.Value.(map[string]any)
		if !ok {
			return an.Errorf("must be an object of strings")
		}
		o.Annotations = make(map[string]string, len(m))
		for _, k := range yamltree.SortedKeys(m) {
			v, err := yamltree.Node{Path: an.Child(k), Value: m[k]}.Scalar()
			if err != nil {
				return err
			}
			o.Annotations[k] = v
		}
	}
	return nil
}

// stringMap reads an object of strings (numbers are kept as text).
func stringMap(n yamltree.Node) (map[string]string, error) {
	m, ok := n.Value.(map[string]any)
	if !ok {
		return nil, n.Errorf("must be an object of strings")
	}
	out := make(map[string]string, len(m))
	for _, k := range yamltree.SortedKeys(m) {
		v, err := yamltree.Node{Path: n.Child(k), Value: m[k]}.Scalar()
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

func requiredString(parent yamltree.Node, obj map[string]yamltree.Node, field string) (string, error) {
	n, ok := obj[field]
	if !ok {
		return "", yamltree.Node{Path: parent.Child(field)}.Errorf("required")
	}
	s, err := n.Str()
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", n.Errorf("must not be empty")
	}
	return s, nil
}

func optionalString(obj map[string]yamltree.Node, field string) (string, error) {
	n, ok := obj[field]
	if !ok || n.Value == nil {
		return "", nil
	}
	return n.Str()
}

// isDNSLabel reports whether s is an RFC 1123 label, as Kubernetes names
// of Services and namespaces are.
func isDNSLabel(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// isDNSName reports whether s is a DNS subdomain of labels (route names
// may hold dots).
func isDNSName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return true
}

func port(n yamltree.Node) (uint16, error) {
	p, err := n.Uint32()
	if err != nil {
		return 0, err
	}
	if p == 0 || p > 65535 {
		return 0, n.Errorf("%d is not a port (1-65535)", p)
	}
	return uint16(p), nil
}
