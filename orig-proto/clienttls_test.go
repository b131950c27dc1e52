package origproto

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A tapped request's event names the identity its server proved in the
// Transport's mTLS handshake (Linkerd's tap shows the server_id of the
// destination's TLS), over HTTP/1 and HTTP/2 inside it; never an identity
// that was only claimed: one that discovery names for a request sent in
// plaintext (a Transport without a client identity), or one that the
// server failed to prove. Not parallel: the server's refusal goes to
// slog.Default().
func TestTapNamesTheServerIdentityTheHandshakeProved(t *testing.T) {
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	server, client, _ := certifiedPair(t)
	addr := meshTLSServer(t, server)
	meshed := NewTransport(WithClientIdentity(client))
	t.Cleanup(meshed.CloseIdleConnections)
	plain := NewTransport()
	t.Cleanup(plain.CloseIdleConnections)
	hub := tap.NewHub()
	w, err := hub.Watch(tap.Filter{}, 16)
	require.NoError(t, err)
	defer w.Close()
	for _, tc := range []struct {
		name     string
		rt       http.RoundTripper
		claimed  string // the identity discovery says the server has
		peer     bool   // HTTP/1 upgraded to HTTP/2
		wantID   string
		wantFail bool
	}{
		{name: "mTLS, HTTP/1", rt: meshed, claimed: booksID, wantID: booksID},
		{name: "mTLS, HTTP/2", rt: meshed, claimed: booksID, peer: true, wantID: booksID},
		{name: "plaintext", rt: plain, claimed: booksID},
		{name: "another identity", rt: meshed, claimed: authorsID, wantFail: true},
	} {
		// What discovery says reaches the Transport through WithPeer and
		// WithServerIdentity, or through an EndpointContext.
		for _, way := range []struct {
			name string
			with func(ctx context.Context, id string, peer bool) context.Context
		}{
			{"With", func(ctx context.Context, id string, peer bool) context.Context {
				return WithPeer(WithServerIdentity(ctx, id), peer)
			}},
			{"EndpointContext", func(ctx context.Context, id string, peer bool) context.Context {
				c := &EndpointContext{Context: ctx, Peer: peer}
				c.SetServerTLS(id, "")
				return c
			}},
		} {
			t.Run(tc.name+"/"+way.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), testutil.Timeout)
				defer cancel()
				ctx = way.with(ctx, tc.claimed, tc.peer)
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
				require.NoError(t, err)
				resp, err := hub.Transport(tc.rt).RoundTrip(req)
				if tc.wantFail {
					require.Error(t, err)
				} else {
					require.NoError(t, err)
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				var e tap.Event
				select {
				case e = <-w.Events():
				default:
					t.Fatal("no event once the response ended")
				}
				assert.Equal(t, tc.wantID, e.ServerID)
				assert.Equal(t, tc.wantFail, e.Error != "", "error %q", e.Error)
			})
		}
	}
}
