package manifest

import (
	"strings"

	"github.com/inmesh/inmesh/identity"
)

// AnnotationRegistrationIdentities lists, on a Service, the mesh identities
// that may register endpoints of it themselves ("id1,id2"), beside the
// service accounts of the Pods its selector matches.
const AnnotationRegistrationIdentities = "inmesh.io/registration-identities"

// registrationIdentities reads the registration-identities annotation; an
// item that is not an identity name is an error naming the field.
func registrationIdentities(a map[string]string) ([]string, error) {
	v, ok := a[AnnotationRegistrationIdentities]
	if !ok {
		return nil, nil
	}
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if err := identity.CheckName(item); err != nil {
			return nil, annotationErr(AnnotationRegistrationIdentities, "%q is not a mesh identity name (such as books.default.serviceaccount.identity.linkerd.cluster.local)", item)
		}
		out = append(out, item)
	}
	return out, nil
}

// RegistrationIdentities returns the identities that may register
// endpoints of the Service svc (namespace/name) themselves: the
// identities of the service accounts of the Pods in its namespace that its
// selector matches (SA.NS.serviceaccount.identity.CONTROLNS.TRUSTDOMAIN,
// by opts), then those of its inmesh.io/registration-identities
// annotation. A Service without a selector binds no Pod (as in
// Kubernetes, where it selects none); nil when the Service does not exist.
func (r *Resources) RegistrationIdentities(namespace, name string, opts InboundOptions) []string {
	svc := r.Service(namespace, name)
	if svc == nil {
		return nil
	}
	if opts.TrustDomain == "" {
		opts.TrustDomain = "cluster.local"
	}
	if opts.ControlNamespace == "" {
		opts.ControlNamespace = "linkerd"
	}
	var out []string
	if len(svc.Selector) > 0 {
		sel := LabelSelector{MatchLabels: svc.Selector}
		for _, p := range r.index().podsByNS[namespace] {
			if sel.Matches(p.Labels) {
				out = append(out, opts.identity(p.ServiceAccountName, p.Namespace))
			}
		}
	}
	ids, _ := registrationIdentities(svc.Annotations)
	return append(out, ids...)
}
