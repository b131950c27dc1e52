// Package cpaddr gives a gRPC client several control-plane replicas: a
// comma-separated list of host:port addresses becomes a target resolved, by
// a resolver registered on that client alone, to every address at once.
// gRPC's default pick_first policy then connects to the first address that
// answers and, when that connection is lost, tries the addresses again in
// order, so that the client moves to a live replica by itself. Only the
// connection moves it: a stream that ends, whatever its status, is opened
// again on the same replica. A replica that must lose its clients (one
// that lost etcd while another reads it, controlplane.Standby) closes
// their connections and fails every new one before the HTTP/2 preface,
// which pick_first counts as a failed address and passes over.
package cpaddr

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
)

// scheme is the target scheme of a list; its resolver is given to each
// client with grpc.WithResolvers, never registered globally.
const scheme = "inmesh-replicas"

// IsList reports whether s names several addresses (it holds a comma).
func IsList(s string) bool { return strings.Contains(s, ",") }

// Split returns the addresses of a comma-separated list, each a host:port
// with a port; spaces around an address are ignored. An empty address, one
// without a port, or a duplicate is an error that names it.
func Split(s string) ([]string, error) {
	parts := strings.Split(s, ",")
	addrs := make([]string, 0, len(parts))
	seen := make(map[string]bool, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("address %d of %q is empty", i+1, s)
		}
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			return nil, fmt.Errorf("address %d of %q: %w", i+1, s, err)
		}
		if host == "" || port == "" {
			return nil, fmt.Errorf("address %d of %q (%s): a host and a port are required", i+1, s, p)
		}
		if seen[p] {
			return nil, fmt.Errorf("address %d of %q (%s) is given twice", i+1, s, p)
		}
		seen[p] = true
		addrs = append(addrs, p)
	}
	if len(addrs) == 0 {
		return nil, errors.New("no address")
	}
	return addrs, nil
}

// Target returns the gRPC target of the list s (see [Split]) and the dial
// option that resolves it: pass both to grpc.NewClient. The addresses are
// tried in the order given.
func Target(s string) (string, grpc.DialOption, error) {
	addrs, err := Split(s)
	if err != nil {
		return "", nil, err
	}
	return scheme + ":///" + strings.Join(addrs, ","), grpc.WithResolvers(builder{addrs: addrs}), nil
}

// builder resolves its target to a fixed list of addresses.
type builder struct{ addrs []string }

func (b builder) Scheme() string { return scheme }

func (b builder) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	state := resolver.State{Addresses: make([]resolver.Address, len(b.addrs))}
	for i, a := range b.addrs {
		state.Addresses[i] = resolver.Address{Addr: a}
	}
	if err := cc.UpdateState(state); err != nil {
		return nil, err
	}
	return static{}, nil
}

// static is a resolver whose answer never changes.
type static struct{}

func (static) ResolveNow(resolver.ResolveNowOptions) {}
func (static) Close()                                {}

// MinPing is the most often a control-plane client pings its connection
// (gRPC raises anything shorter to it) and the most often inmesh's control
// plane lets clients ping: a client pings a silent connection so that it
// notices a replica lost without a reset (its host gone, a frozen process)
// and moves to a live one.
const MinPing = 10 * time.Second

// The control-plane clients' keepalive defaults: DefaultPing is the most
// often a gRPC-Go server with default settings (Linkerd's Destination and
// Identity controllers) lets a client ping, and DefaultPingTimeout how long
// the answer may take before the connection is dropped. NoPing is gRPC's
// keepalive time that turns the pings off.
const (
	DefaultPing        = 5 * time.Minute
	DefaultPingTimeout = 20 * time.Second
	NoPing             = time.Duration(math.MaxInt64)
)
