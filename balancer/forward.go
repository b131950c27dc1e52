package balancer

import (
	"runtime"
	"sync"
	"weak"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
)

// forwardLabels holds the metric labels of the endpoints that [WithForward]
// names, made once per endpoint: a forward endpoint lives in a policy's
// table (a forward backend, a mirror, the endpoint of a pod's address) and
// every request to it carries the same labels. They name no authority: a
// forward has none, and Linkerd's proxy labels its endpoint's requests
// with none (see classify.Labels.WithoutAuthority). An endpoint's entry
// goes when the endpoint is no longer reachable, with the table that held
// it.
type forwardLabels struct {
	m sync.Map // weak.Pointer[endpoint.Endpoint] -> *classify.Labels
}

// of returns the labels of ep (see endpointLabels).
func (f *forwardLabels) of(ep *endpoint.Endpoint, meshTLS bool) *classify.Labels {
	k := weak.Make(ep)
	if l, ok := f.m.Load(k); ok {
		return l.(*classify.Labels)
	}
	l, loaded := f.m.LoadOrStore(k, endpointLabels(*ep, meshTLS).WithoutAuthority())
	if !loaded {
		runtime.AddCleanup(ep, f.forget, k)
	}
	return l.(*classify.Labels)
}

func (f *forwardLabels) forget(k weak.Pointer[endpoint.Endpoint]) { f.m.Delete(k) }
