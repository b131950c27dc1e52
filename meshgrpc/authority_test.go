package meshgrpc_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/credentials"
	xcredentials "google.golang.org/grpc/experimental/credentials"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/meshgrpc"
)

// The first call of a new channel to an endpoint with an authority
// override carries the override as its :authority, over plaintext as over
// mTLS (whose server certificate names the endpoint's identity, not the
// override), as Linkerd's proxy replaces the authority of a request to
// such an endpoint (linkerd/app/outbound/src/http/endpoint.rs,
// NewOverrideAuthority; linkerd/http/override-authority/src/lib.rs,
// set_authority) and the HTTP stack its Host. The override applies to a
// balanced Service's endpoint and to the forward to a workload's own
// address alike. An endpoint without one, or with a value that is no
// authority, gets the channel's authority. Against the embedded control
// plane, which sends the endpoints' overrides.
func TestAuthorityOverride(t *testing.T) {
	const override = "books.east.svc.cluster.local:7000"
	d, _, err := controlplane.LoadIdentityDir(t.TempDir())
	require.NoError(t, err)
	server := certified(t, d, booksID)
	client := certified(t, d, webID)
	for _, tc := range []struct {
		name string
		// local: the channel has an identity; mtls: the endpoint too,
		// and its server proves it.
		local, mtls bool
		// toAddr: the channel's target is the endpoint's address, which
		// the policy forwards to, rather than books.
		toAddr   bool
		override string
		want     string // the :authority the server sees; "": the target
	}{
		{name: "plaintext", want: ""},
		{name: "plaintext, an override", override: override, want: override},
		{name: "an identity, a plaintext endpoint, an override", local: true, override: override, want: override},
		{name: "mTLS", local: true, mtls: true, want: ""},
		{name: "mTLS, an override", local: true, mtls: true, override: override, want: override},
		{name: "a forward to the address, an override", toAddr: true, override: override, want: override},
		{name: "an override that is no authority", override: "books east", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan string, 1)
			var creds credentials.TransportCredentials
			if tc.mtls {
				creds = xcredentials.NewTLSWithALPNDisabled(server.ServerConfig())
			}
			a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
				md, _ := metadata.FromIncomingContext(ctx)
				select {
				case seen <- firstMD(md, ":authority"):
				default:
				}
				return nil
			}}, creds)
			ep := endpoint.Endpoint{Addr: a.addr, Weight: endpoint.DefaultWeight, AuthorityOverride: tc.override}
			if tc.mtls {
				ep.Identity = booksID
			}
			store := controlplane.NewStore()
			manifests(t, store, booksService)
			store.SetEndpoints(map[string][]endpoint.Endpoint{books: {ep}})
			var opts []meshgrpc.Option
			if tc.local {
				opts = append(opts, meshgrpc.WithIdentity(client))
			}
			target := books
			if tc.toAddr {
				target = a.addr.String()
			}
			c := dialTarget(t, serveEmbedded(t, store), target, opts...)

			_, err := c.EmptyCall(callCtx(t), &testgrpc.Empty{})
			require.NoError(t, err)
			want := tc.want
			if want == "" {
				want = target
			}
			assert.Equal(t, want, testutil.Recv(t, seen, "the first call"))
		})
	}
}

// A call's own l5d-dst-canonical metadata does not reach an endpoint with
// an authority override, as Linkerd's proxy removes the header with the
// authority of a request to such an endpoint
// (linkerd/app/outbound/src/http/endpoint.rs, NewOverrideAuthority with
// "host" and l5d-dst-canonical) and as the HTTP stack does (mesh
// TestAuthorityOverrideRemovesCanonicalDst); an endpoint without one, or
// with a value that is no authority, gets the call's values as they were.
// The first call, unary and server-streaming, of a new channel, to a
// Service's endpoint, to the forward to an address, and to the endpoint of
// the Service a ServiceProfile's dst override sends books's calls to.
func TestAuthorityOverrideRemovesCanonicalDst(t *testing.T) {
	const override = "books.east.svc.cluster.local:7000"
	for _, tc := range []struct {
		name     string
		toAddr   bool // the channel's target is the endpoint's address
		split    bool // books's profile overrides books to authors, the endpoint's Service
		override string
		want     string // the l5d-dst-canonical values the server sees
	}{
		{name: "an endpoint without an override", want: "books.default.svc.cluster.local:7000,second"},
		{name: "an endpoint with an override", override: override},
		{name: "an override that is no authority", override: "books east", want: "books.default.svc.cluster.local:7000,second"},
		{name: "a forward to the address, an override", toAddr: true, override: override},
		{name: "a dst override to a Service whose endpoint has an override", split: true, override: override},
		{name: "a dst override to a Service whose endpoint has none", split: true, want: "books.default.svc.cluster.local:7000,second"},
	} {
		for _, stream := range []bool{false, true} {
			kind := "unary"
			if stream {
				kind = "stream"
			}
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				seen := make(chan string, 1)
				a := startApp(t, &app{handle: func(ctx context.Context, _ int64) error {
					md, _ := metadata.FromIncomingContext(ctx)
					select {
					case seen <- strings.Join(md[canonicalDst], ","):
					default:
					}
					return nil
				}}, nil)
				ep := endpoint.Endpoint{Addr: a.addr, Weight: endpoint.DefaultWeight, AuthorityOverride: tc.override}
				store := controlplane.NewStore()
				manifests(t, store, booksService)
				if tc.split {
					setOverrides(t, store, "", authors+" 1")
					// books's own endpoint, which the split leaves, never
					// reports to seen.
					store.SetEndpoints(map[string][]endpoint.Endpoint{authors: {ep}, books: {{Addr: serveTestService(t, &app{})}}})
				} else {
					store.SetEndpoints(map[string][]endpoint.Endpoint{books: {ep}})
				}
				target := books
				if tc.toAddr {
					target = a.addr.String()
				}
				c := dialTarget(t, serveEmbedded(t, store), target)

				ctx := metadata.AppendToOutgoingContext(callCtx(t), canonicalDst, books, canonicalDst, "second")
				require.NoError(t, requireIDCall(ctx, c, stream))
				assert.Equal(t, tc.want, testutil.Recv(t, seen, "the first call"))
			})
		}
	}
}

// canonicalDst is the metadata key of l5d-dst-canonical.
const canonicalDst = "l5d-dst-canonical"
