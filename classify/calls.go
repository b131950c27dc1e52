package classify

import (
	"context"
	"strconv"
	"time"
)

// Calls records request_total, response_total (with classification) and
// response_latency_ms, direction outbound, for calls that a transport
// other than net/http makes (grpc-go's, say), with the labels a
// [Transport] gives its series: the authority, and the endpoint's labels
// ([NewLabels]: dst_*, tls). It is safe for concurrent use.
type Calls struct {
	rec        *recorder
	classifier *Classifier
}

// NewCalls returns a recorder of calls with the options of [NewTransport].
func NewCalls(opts ...Option) *Calls {
	cfg := newConfig(opts)
	return &Calls{rec: newRecorder(cfg, "outbound"), classifier: cfg.classifier}
}

// StartGRPC counts a gRPC call to authority on an endpoint labelled l (nil:
// none) and returns the function that records its end: the gRPC status
// code when the server answered, else err's class (a timeout, a reset,
// unclassified), as the Transport classifies a failed exchange. The
// classifier is the options' ([WithClassifier]; default: the default
// gRPC rules).
func (c *Calls) StartGRPC(ctx context.Context, authority string, l *Labels) func(ctx context.Context, code int32, answered bool, err error) {
	start := time.Now()
	tg := c.rec.target(authority, l)
	tg.Request(ctx)
	return func(ctx context.Context, code int32, answered bool, err error) {
		if !answered {
			tg.Response(ctx, response(0, ErrorClass(ctx, err)), start)
			return
		}
		class := c.classifier.EndStatus(Class{GRPCStatus: -1}, true, strconv.Itoa(int(code)), true)
		tg.Response(ctx, response(200, class), start)
	}
}
