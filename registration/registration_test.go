package registration_test

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/registration"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func books(addr string) []registration.Endpoint {
	return []registration.Endpoint{{Authority: "books.default.svc.cluster.local:7000", Addr: netip.MustParseAddrPort(addr), H2: true}}
}

func waitAccepted(t *testing.T, r *registration.Registration) {
	t.Helper()
	select {
	case <-r.Accepted():
	case <-time.After(testutil.Timeout):
		t.Fatalf("not accepted: %v", r.Err())
	}
}

// Register waits for no control plane: it returns at once while none
// listens, and the endpoints are registered once one starts.
func TestRegisterBeforeTheControlPlane(t *testing.T) {
	addr := testutil.FreeAddr(t)
	conn, err := registration.Dial(addr, nil, "")
	require.NoError(t, err)
	defer conn.Close()
	fast, err := backoff.Fixed(50 * time.Millisecond)
	require.NoError(t, err)
	start := time.Now()
	r, err := registration.Register(context.Background(), conn, books("127.0.0.1:4001"), registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), time.Second, "Register returned at once")
	assert.ErrorIs(t, r.Err(), registration.ErrPending, "not registered while no control plane answers")

	regtest.StartOn(t, addr, regtest.Manifests, controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet))
	waitAccepted(t, r)
	assert.NoError(t, r.Err())
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, r.Deregister(ctx))
}

// A refused registration keeps its reason in Err and is retried; a
// control plane that refuses plaintext names it.
func TestRefusedIsRetried(t *testing.T) {
	c := regtest.Start(t, regtest.Manifests, controlplane.WithLogger(quiet))
	fast, err := backoff.Fixed(20 * time.Millisecond)
	require.NoError(t, err)
	r, err := registration.Register(context.Background(), c.Dial(t, nil), books("127.0.0.1:4001"), registration.WithLogger(quiet), registration.WithRetry(fast))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return status.Code(r.Err()) == codes.PermissionDenied }, testutil.Timeout, 10*time.Millisecond)
	assert.Contains(t, r.Err().Error(), "no verified mTLS identity")
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
	defer cancel()
	require.NoError(t, r.Deregister(ctx))
}

// Endpoints that cannot be sent are errors of Register.
func TestRegisterInvalid(t *testing.T) {
	conn, err := registration.Dial(testutil.FreeAddr(t), nil, "")
	require.NoError(t, err)
	defer conn.Close()
	for _, tc := range []struct {
		name string
		eps  []registration.Endpoint
		want string
	}{
		{"none", nil, "no endpoint"},
		{"no authority", []registration.Endpoint{{Addr: netip.MustParseAddrPort("127.0.0.1:1")}}, "endpoint 0: an authority and an address are required"},
		{"no address", []registration.Endpoint{{Authority: "books.default.svc.cluster.local:7000"}}, "endpoint 0: an authority and an address are required"},
		{"h2 and opaque", []registration.Endpoint{{Authority: "books.default.svc.cluster.local:7000", Addr: netip.MustParseAddrPort("127.0.0.1:1"), H2: true, Opaque: true}}, "exclude each other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := registration.Register(context.Background(), conn, tc.eps)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
