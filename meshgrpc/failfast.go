package meshgrpc

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// failFastPrefix begins the text of every fail-fast error of the picker,
// by which the interceptors know it once grpc-go made it a status.
const failFastPrefix = "meshgrpc: failing fast: "

// newFailFastError is the picker's answer to a call of a backend in
// failfast (no endpoint of it in rotation within its failfast timeout;
// empty: its endpoint set is empty), naming the last connection error of
// its endpoints when they failed to connect. It is not a status: grpc-go
// ends a fail-fast call with a picker's plain error, as UNAVAILABLE with
// its text, and keeps a wait-for-ready call waiting for the next picker,
// where a status error would end both.
func newFailFastError(bp pickPool, backend string, empty bool) error {
	if empty {
		return fmt.Errorf("%sno endpoints for %s within %s", failFastPrefix, backend, bp.pool.FailFast())
	}
	if bp.lastErr != nil {
		return fmt.Errorf("%sno endpoint of %s ready within %s (last connection error: %v)",
			failFastPrefix, backend, bp.pool.FailFast(), bp.lastErr)
	}
	return fmt.Errorf("%sno endpoint of %s ready within %s", failFastPrefix, backend, bp.pool.FailFast())
}

// failFastStatus returns err, the end of a call, with the balancer's
// fail-fast made DEADLINE_EXCEEDED: Linkerd's proxy answers a request
// that no endpoint took within the failfast timeout as a gateway timeout
// (HTTP 504, grpc-status DEADLINE_EXCEEDED), and the HTTP stack does the
// same. A picker cannot answer so itself without ending wait-for-ready
// calls too (see [newFailFastError]), so the interceptors translate the
// UNAVAILABLE grpc-go made of its error here. Any other error is err.
// An UNAVAILABLE that a server sent with the same text would be
// translated too; no meshgrpc server sends one.
func failFastStatus(err error) error {
	if !failedFast(err) {
		return err
	}
	return status.Error(codes.DeadlineExceeded, status.Convert(err).Message())
}

// failedFast reports whether err is the picker's fail-fast as grpc-go
// ends a fail-fast call with it (UNAVAILABLE with its text).
func failedFast(err error) bool {
	if err == nil {
		return false
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable && strings.HasPrefix(s.Message(), failFastPrefix)
}

// unaryInterceptor is the client's unary interceptor: [mesh.unary], its
// fail-fast answered as [failFastStatus] says.
func (m *mesh) unaryInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return failFastStatus(m.unary(ctx, method, req, reply, cc, invoker, opts...))
}

// streamInterceptor is the client's stream interceptor: [mesh.stream],
// its fail-fast answered as [failFastStatus] says. A stream picks as it
// opens, so its fail-fast is the error that opening returns; the pick of
// a transparent retry of grpc-go (a stream the server refused unread)
// comes later, in a read, and its fail-fast stays UNAVAILABLE.
func (m *mesh) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if desc.ServerStreams {
		streamer = firstDataStreamer(streamer)
	}
	s, err := m.stream(ctx, desc, cc, method, streamer, opts...)
	return s, failFastStatus(err)
}
