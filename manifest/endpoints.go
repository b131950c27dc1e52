package manifest

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/identity"
	authpkg "github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/yamltree"
)

// The bounds of an endpoint's metric labels: in an endpoints file or a Get
// stream, an endpoint beyond them is an error naming the field.
const (
	MaxEndpointLabels = 32  // labels of one endpoint
	MaxLabelKeyLen    = 63  // bytes of one label key
	MaxLabelValueLen  = 253 // bytes of one label value
)

// CheckLabels applies the label bounds; the error names the label at
// fault.
func CheckLabels(labels map[string]string) error {
	if len(labels) > MaxEndpointLabels {
		return fmt.Errorf("%d labels, more than %d", len(labels), MaxEndpointLabels)
	}
	for k, v := range labels {
		switch {
		case k == "":
			return errors.New("empty label key")
		case len(k) > MaxLabelKeyLen:
			return fmt.Errorf("label key %.20q... is %d bytes, more than %d", k, len(k), MaxLabelKeyLen)
		case len(v) > MaxLabelValueLen:
			return fmt.Errorf("label %s: value is %d bytes, more than %d", k, len(v), MaxLabelValueLen)
		}
	}
	return nil
}

// ParseEndpoints reads an endpoints file: a YAML list of authorities and
// their endpoints.
//
//   - authority: books.default.svc.cluster.local:7000
//     endpoints:
//   - addr: 127.0.0.1:4143       # ip:port
//     weight: 10000              # optional, default 10000
//     h2: true                   # protocol hint: a mesh peer (orig-proto)
//     opaque: true               # optional protocol hint: opaque traffic
//     opaqueTransportPort: 4143  # optional
//     identity: books.default.serviceaccount.identity.linkerd.cluster.local
//     serverName: books.example  # optional: the TLS server name to send
//     authorityOverride: books.default.svc.cluster.local:7000  # optional
//     labels: {pod: books-0}     # optional metric labels
//     zone: zone-a               # optional: the endpoint's zone
//
// opaque marks an endpoint whose port takes opaque traffic (Linkerd's
// protocol_hint.opaque, from the pod's config.linkerd.io/opaque-ports); a
// meshed endpoint (one with an identity) on one of [DefaultOpaquePorts] is
// opaque unless it says opaque: false, as Linkerd's controller hints it
// (controller/api/destination/endpoint_translator.go). An opaque endpoint
// cannot also be h2: the hint is one or the other.
//
// identity is a DNS-like name, or a URI (a SPIFFE identity such as
// spiffe://example.org/ns/books/sa/books). serverName is the DNS-like
// name that the endpoint answers TLS for (the server name a client
// sends), when it is not the identity: a URI identity needs one, as
// Linkerd's ExternalWorkload gives its spec.meshTLS.serverName beside its
// SPIFFE identity (controller/api/destination/endpoint_translator.go);
// Linkerd's proxy does not take a URI for a server name, and without a
// server name it ignores a URI identity.
//
// zone is the endpoint's zone (its topology.kubernetes.io/zone), which
// zone-aware balancing reads: it is the endpoint's "zone" label, as
// Linkerd's destination controller sends a zone, so it is the same as
// labels: {zone: zone-a}; given both ways, the two must agree.
//
// An authority with an empty list exists with no endpoints. A state with no
// authorities at all is written as an explicit empty list, []: an empty file
// (or one of only spaces and comments, or null) is an error, because that is
// what a file truncated or caught half-way through a copy looks like. A key
// given twice is an error. Each endpoint has at most [MaxEndpointLabels]
// labels, keys of at most [MaxLabelKeyLen] bytes and values of at most
// [MaxLabelValueLen]. Errors name the field, as in
// "[0].endpoints[1].addr: ...".
func ParseEndpoints(data []byte) (map[string][]endpoint.Endpoint, error) {
	out := make(map[string][]endpoint.Endpoint)
	if yamltree.Blank(data) {
		return nil, errEmptyEndpoints
	}
	root, err := yamltree.Decode(data)
	if err != nil {
		return nil, err
	}
	if root.Value == nil {
		return nil, errEmptyEndpoints
	}
	entries, err := root.List()
	if err != nil {
		return nil, err
	}
	for _, entry := range entries {
		obj, err := entry.Object("authority", "endpoints")
		if err != nil {
			return nil, err
		}
		an, ok := obj["authority"]
		if !ok {
			return nil, yamltree.Node{Path: entry.Child("authority")}.Errorf("required")
		}
		authority, err := an.Str()
		if err != nil {
			return nil, err
		}
		if authority, err = authpkg.Normalize(authority); err != nil {
			return nil, an.Errorf("%v", err)
		}
		if _, dup := out[authority]; dup {
			return nil, an.Errorf("%s is listed twice", authority)
		}
		var eps []endpoint.Endpoint
		if en, ok := obj["endpoints"]; ok && en.Value != nil {
			items, err := en.List()
			if err != nil {
				return nil, err
			}
			for _, item := range items {
				e, err := parseEndpoint(item)
				if err != nil {
					return nil, err
				}
				eps = append(eps, e)
			}
		}
		out[authority] = eps
	}
	return out, nil
}

// errEmptyEndpoints is why an empty endpoints file is refused.
var errEmptyEndpoints = errors.New("the endpoints file is empty (truncated, or still being written?); write [] for a state with no authorities")

func parseEndpoint(n yamltree.Node) (endpoint.Endpoint, error) {
	obj, err := n.Object("addr", "weight", "h2", "opaque", "opaqueTransportPort", "identity", "serverName", "authorityOverride", "labels", "zone")
	if err != nil {
		return endpoint.Endpoint{}, err
	}
	e := endpoint.Endpoint{Weight: endpoint.DefaultWeight}
	an, ok := obj["addr"]
	if !ok {
		return e, yamltree.Node{Path: n.Child("addr")}.Errorf("required")
	}
	addr, err := an.Str()
	if err != nil {
		return e, err
	}
	if e.Addr, err = netip.ParseAddrPort(addr); err != nil || e.Addr.Port() == 0 {
		return e, an.Errorf("%q is not an ip:port address", addr)
	}
	if wn, ok := obj["weight"]; ok {
		if e.Weight, err = wn.Uint32(); err != nil {
			return e, err
		}
	}
	if hn, ok := obj["h2"]; ok {
		if e.H2, err = hn.Bool(); err != nil {
			return e, err
		}
	}
	if pn, ok := obj["opaqueTransportPort"]; ok {
		if e.OpaqueTransportPort, err = pn.Uint32(); err != nil {
			return e, err
		}
		if e.OpaqueTransportPort == 0 || e.OpaqueTransportPort > 0xffff {
			return e, pn.Errorf("%d is not a port", e.OpaqueTransportPort)
		}
	}
	if in, ok := obj["identity"]; ok {
		if e.Identity, err = in.Str(); err != nil {
			return e, err
		}
	}
	if sn, ok := obj["serverName"]; ok {
		if e.ServerName, err = sn.Str(); err != nil {
			return e, err
		}
		if identity.CheckName(e.ServerName) != nil {
			return e, sn.Errorf("%q is not a DNS-like name (such as books.example)", e.ServerName)
		}
		if e.Identity == "" {
			return e, sn.Errorf("a server name needs an identity")
		}
	}
	if on, ok := obj["authorityOverride"]; ok {
		if e.AuthorityOverride, err = on.Str(); err != nil {
			return e, err
		}
	}
	if on, ok := obj["opaque"]; ok {
		if e.Opaque, err = on.Bool(); err != nil {
			return e, err
		}
		if e.Opaque && e.H2 {
			return e, on.Errorf("an endpoint is h2 or opaque, not both")
		}
	} else {
		e.Opaque = e.Identity != "" && slices.Contains(DefaultOpaquePorts, e.Addr.Port())
	}
	if ln, ok := obj["labels"]; ok && ln.Value != nil {
		m, ok := ln.Value.(map[string]any)
		if !ok {
			return e, ln.Errorf("must be an object of strings")
		}
		e.Labels = make(map[string]string, len(m))
		for _, k := range yamltree.SortedKeys(m) {
			v, err := yamltree.Node{Path: ln.Child(k), Value: m[k]}.Scalar()
			if err != nil {
				return e, err
			}
			e.Labels[k] = v
		}
		if err := CheckLabels(e.Labels); err != nil {
			return e, ln.Errorf("%v", err)
		}
	}
	if zn, ok := obj["zone"]; ok {
		zone, err := zn.Str()
		if err != nil {
			return e, err
		}
		if zone == "" {
			return e, zn.Errorf("must not be empty")
		}
		if l, ok := e.Labels[ZoneLabel]; ok && l != zone {
			return e, zn.Errorf("%q differs from labels.%s %q", zone, ZoneLabel, l)
		}
		if e.Labels == nil {
			e.Labels = make(map[string]string, 1)
		}
		e.Labels[ZoneLabel] = zone
		if err := CheckLabels(e.Labels); err != nil {
			return e, zn.Errorf("%v", err)
		}
	}
	return e, nil
}

// ZoneLabel is the endpoint label that holds its zone, as Linkerd's
// destination controller names it in an address's metric labels (and
// balancer.ZoneLabel reads it).
const ZoneLabel = "zone"
