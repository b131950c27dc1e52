package main

import (
	"encoding/json"
	"net/http"
	"net/netip"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
)

// explainInbound answers /routes?direction=inbound: how the inbound policy
// of the application's port would treat a request of method to path from
// client (an IP, default 127.0.0.1) with the verified identity client_id
// (none: plaintext).
func explainInbound(w http.ResponseWriter, r *http.Request, stack *mesh.Server, app string) {
	h := stack.InboundPolicy()
	if h == nil {
		http.Error(w, "no inbound policy: start the proxy with -workload", http.StatusNotFound)
		return
	}
	appAddr, err := netip.ParseAddrPort(app)
	if err != nil {
		http.Error(w, "-app is not an IP address and port", http.StatusInternalServerError)
		return
	}
	q := r.URL.Query()
	client := netip.MustParseAddr("127.0.0.1")
	if c := q.Get("client"); c != "" {
		if client, err = netip.ParseAddr(c); err != nil {
			http.Error(w, "client: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	var peer identity.Peer
	if id := q.Get("client_id"); id != "" {
		peer = identity.Peer{TLS: true, ID: id}
	}
	method, path := q.Get("method"), q.Get("path")
	if method == "" {
		method = http.MethodGet
	}
	if path == "" {
		path = "/"
	}
	probe, err := http.NewRequestWithContext(r.Context(), method, "http://"+app+path, nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(h.Explain(appAddr.Port(), probe, client, peer))
}
