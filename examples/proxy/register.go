package main

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/registration"
	"google.golang.org/grpc"
)

// registerFlags are the proxy's self-registration settings.
type registerFlags struct {
	authorities []string
	addr        string            // the advertised address; default -inbound's
	labels      map[string]string // zone=..., ...
	controlAddr string            // the Registration API; default -identity-addr with an identity, else -destination
}

func (f *registerFlags) register(fs *flag.FlagSet) {
	fs.Func("register", "register -inbound as an endpoint of this Service port (name.ns.svc.cluster.local:port) with the control plane, deregistered first on shutdown; repeatable",
		func(s string) error { f.authorities = append(f.authorities, s); return nil })
	fs.StringVar(&f.addr, "register-addr", "", "the address to register (ip:port; default the -inbound listener's, which must then be a specific IP)")
	fs.Func("register-label", "a metric label of the registered endpoint, key=value (zone=zone-a); repeatable",
		func(s string) error {
			k, v, ok := strings.Cut(s, "=")
			if !ok || k == "" {
				return fmt.Errorf("%q: want key=value", s)
			}
			if f.labels == nil {
				f.labels = map[string]string{}
			}
			f.labels[k] = v
			return nil
		})
	fs.StringVar(&f.controlAddr, "registration-addr", "", "the control plane's Registration API, or several replicas comma-separated (default: -identity-addr over mTLS with an identity, else -destination in plaintext, which only a control plane with -insecure-registration accepts)")
}

// option returns the inbound stack's registration option (nil without
// -register) and the connection to close at exit.
func (f registerFlags) option(local *identity.Local, idf identityFlags, destinationAddr string) (mesh.ServerOption, *grpc.ClientConn, error) {
	if len(f.authorities) == 0 {
		return nil, nil, nil
	}
	var ap netip.AddrPort
	if f.addr != "" {
		var err error
		if ap, err = netip.ParseAddrPort(f.addr); err != nil {
			return nil, nil, fmt.Errorf("-register-addr: %w", err)
		}
	}
	eps := make([]registration.Endpoint, len(f.authorities))
	for i, a := range f.authorities {
		eps[i] = registration.Endpoint{Authority: a, Addr: ap, Labels: f.labels}
	}
	addr, serverName := f.controlAddr, ""
	if local != nil {
		serverName = idf.serverName
		if addr == "" {
			addr = idf.addr
		}
	} else if addr == "" {
		addr = destinationAddr
	}
	conn, err := registration.Dial(addr, local, serverName)
	if err != nil {
		return nil, nil, fmt.Errorf("-register: %w", err)
	}
	return mesh.WithRegistration(conn, eps), conn, nil
}
