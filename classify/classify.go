package classify

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http2"
)

// Class is the outcome of one HTTP exchange.
type Class struct {
	// Failure is false for a success.
	Failure bool
	// GRPCStatus is the gRPC status code that decided the class, or -1.
	GRPCStatus int32
	// NoGRPCStatus is set for a gRPC call classified by its grpc-status
	// that ended without one (Linkerd's GrpcOpen class at its end): a
	// success whose grpc_status label is 2, Unknown, as Linkerd's
	// classifier makes it. GRPCStatus stays -1: no status came, and a
	// retry reads none, as Linkerd's retries read the status from the
	// response itself.
	NoGRPCStatus bool
	// Error is set when no complete response was had: "timeout",
	// "h2(REASON)" for an HTTP/2 reset or GOAWAY, or "unclassified".
	Error string
}

// success and failure are the classes of plain HTTP outcomes.
var (
	success = Class{GRPCStatus: -1}
	failure = Class{Failure: true, GRPCStatus: -1}
)

// GRPCStatusLabel returns the code of the grpc_status label, -1 for an
// empty one: GRPCStatus, or 2 (Unknown) for a gRPC call that ended without
// a status (linkerd2-proxy linkerd/app/core/src/classify.rs, Eos::GrpcOpen,
// whose class linkerd/app/core/src/metrics.rs writes with its code).
func (c Class) GRPCStatusLabel() int32 {
	if c.NoGRPCStatus {
		return grpcUnknown
	}
	return c.GRPCStatus
}

// grpcUnknown is the gRPC status code Unknown.
const grpcUnknown = 2

// Classification returns "success" or "failure", the classification label.
func (c Class) Classification() string {
	if c.Failure {
		return "failure"
	}
	return "success"
}

// StatusMatcher reports whether a status code matches a condition.
type StatusMatcher interface{ MatchStatus(code int) bool }

// ResponseClass marks the responses whose status matches as failures or
// successes.
type ResponseClass struct {
	Match   StatusMatcher
	Failure bool
}

// Classifier classifies responses. Its zero value applies the default rules;
// a Classifier is read-only once in use and safe for concurrent use.
type Classifier struct {
	// Classes are a route's response classes: the first whose Match
	// accepts the status decides, at the head. When none matches, the
	// default rules apply.
	Classes []ResponseClass
	// GRPCFailureCodes are the gRPC codes that count as failures; nil
	// means those of [DefaultGRPCFailureCodes].
	GRPCFailureCodes []int32
	// LegacyGRPC restores the rule of 2018 proxies: every gRPC code other
	// than 0 is a failure, and a gRPC response without a status too.
	LegacyGRPC bool
}

// DefaultGRPCFailureCodes returns the codes Linkerd counts as failures:
// Unknown, DeadlineExceeded, PermissionDenied, Internal, Unavailable and
// DataLoss. Each call returns a new slice.
func DefaultGRPCFailureCodes() []int32 { return slices.Clone(defaultGRPCFailureCodes[:]) }

var defaultGRPCFailureCodes = [...]int32{2, 4, 7, 13, 14, 15}

// Default returns a new Classifier with the default rules: the zero
// Classifier, which a nil *Classifier means too.
func Default() *Classifier { return &Classifier{} }

// defaultClassifier is what a nil *Classifier classifies with.
var defaultClassifier Classifier

// IsGRPC reports whether the request is a gRPC call (content-type
// application/grpc, with or without a +suffix).
func IsGRPC(h http.Header) bool {
	ct := h["Content-Type"] // canonical already: no Get, which canonicalizes
	return len(ct) > 0 && strings.HasPrefix(ct[0], "application/grpc")
}

// Head classifies a response head. When final is false the class is
// tentative and [Classifier.End] decides with the trailers.
//
// As Linkerd's classifier (linkerd2-proxy linkerd/app/core/src/classify.rs):
// a route's classes decide first; without classes, a plain HTTP request is
// classified by its status alone, whatever grpc-status the response
// carries, and a gRPC request by its grpc-status, whatever the HTTP status
// (none at all is a success); with classes none of which matches, the
// grpc-status decides, then the HTTP status.
func (c *Classifier) Head(grpcRequest bool, status int, header http.Header) (class Class, final bool) {
	if c == nil {
		c = &defaultClassifier
	}
	for _, rc := range c.Classes {
		if rc.Match != nil && rc.Match.MatchStatus(status) {
			return Class{Failure: rc.Failure, GRPCStatus: -1}, true
		}
	}
	if len(c.Classes) == 0 && !grpcRequest {
		return httpClass(status), true
	}
	if code, ok := grpcStatus(header); ok {
		return c.grpcClass(code), true
	}
	if len(c.Classes) == 0 {
		// A gRPC call without grpc-status in its head (Linkerd's
		// GrpcOpen): the trailers decide, and without one it succeeded.
		return success, false
	}
	return httpClass(status), false
}

// httpClass is the class of a plain HTTP status: failure exactly for 5xx.
func httpClass(status int) Class {
	if status >= 500 && status <= 599 {
		return failure
	}
	return success
}

// End finishes a tentative class with the response trailers (nil when the
// stream had none): a grpc-status trailer decides; without one a tentative
// HTTP class stands, a gRPC call classified by its status is a success
// without one ([Class.NoGRPCStatus]), and under the legacy rule a failure.
func (c *Classifier) End(tentative Class, grpcRequest bool, trailers http.Header) Class {
	if c == nil {
		c = &defaultClassifier
	}
	code, ok := grpcStatus(trailers)
	return c.endCode(tentative, grpcRequest, code, ok)
}

// EndStatus is [Classifier.End] for a grpc-status value already looked up.
func (c *Classifier) EndStatus(tentative Class, grpcRequest bool, value string, ok bool) Class {
	if c == nil {
		c = &defaultClassifier
	}
	var code int32
	if ok {
		code, ok = parseGRPCStatus(value)
	}
	return c.endCode(tentative, grpcRequest, code, ok)
}

// GRPCCall returns the class of a gRPC call that ended with status code
// (negative: without one), whose response came as gRPC sends every
// response: HTTP status 200, the status in the trailers. A code past 16
// is Unknown, as [Classifier.End] reads one. It allocates nothing.
func (c *Classifier) GRPCCall(code int64) Class {
	if c == nil {
		c = &defaultClassifier
	}
	class, final := c.Head(true, http.StatusOK, nil)
	if final {
		return class
	}
	n, ok := grpcCode(code)
	return c.endCode(class, true, n, ok)
}

// endCode is [Classifier.EndStatus] for a grpc-status code already parsed
// and read as Linkerd reads one (grpcCode; ok false: none).
func (c *Classifier) endCode(tentative Class, grpcRequest bool, code int32, ok bool) Class {
	if c == nil {
		c = &defaultClassifier
	}
	if ok {
		return c.grpcClass(code)
	}
	if grpcRequest && len(c.Classes) == 0 {
		if c.LegacyGRPC {
			return Class{Failure: true, GRPCStatus: 0}
		}
		// Linkerd's GrpcOpen ended without a status: Grpc(Ok(Unknown)).
		return Class{GRPCStatus: -1, NoGRPCStatus: true}
	}
	return tentative
}

func (c *Classifier) grpcClass(code int32) Class {
	if c.LegacyGRPC {
		return Class{Failure: code != 0, GRPCStatus: code}
	}
	codes := c.GRPCFailureCodes
	if codes == nil {
		codes = defaultGRPCFailureCodes[:]
	}
	for _, f := range codes {
		if f == code {
			return Class{Failure: true, GRPCStatus: code}
		}
	}
	return Class{GRPCStatus: code}
}

// grpcStatus parses grpc-status; a value that does not parse counts as
// absent.
func grpcStatus(h http.Header) (int32, bool) {
	v, ok := h["Grpc-Status"]
	if !ok || len(v) == 0 {
		return 0, false
	}
	return parseGRPCStatus(v[0])
}

// parseGRPCStatus parses a grpc-status value as Linkerd's classifier does
// (linkerd2-proxy linkerd/app/core/src/classify.rs grpc_code): a number of
// 16 bits, or none; a code beyond the 17 that gRPC defines is Unknown (2),
// as tonic's Code::from_i32 makes it, a failure by default. So whatever a
// server sends, the grpc_status label takes one of 17 values.
func parseGRPCStatus(v string) (int32, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil {
		return 0, false
	}
	return grpcCode(n)
}

// grpcCode is a grpc-status code as Linkerd's classifier reads it (see
// parseGRPCStatus): none past 16 bits, Unknown past the 17 codes.
func grpcCode(n int64) (int32, bool) {
	switch {
	case n < 0 || n > 0xffff:
		return 0, false
	case n > 16:
		return grpcUnknown, true
	}
	return int32(n), true
}

// ErrTimeout is the cause a layer gives when it cancels a request because a
// timeout fired; [ErrorClass] labels such failures "timeout".
var ErrTimeout = errors.New("classify: request timed out")

// ErrEndpointTimeout marks a timeout cause as one that bounds a request at
// its endpoint: a policy route's request, response, idle and retry
// timeouts, which Linkerd's proxy enforces in the endpoint's stack, under
// its breaker (linkerd2-proxy linkerd/app/outbound/src/http/endpoint.rs,
// EnforceTimeouts), so that their error is a failure of the endpoint
// (linkerd/app/core/src/classify.rs, Class::Error). A balancer counts a
// request whose context ended with such a cause as a failure; one its
// caller gave up, or a timeout above the balancer ended (a ServiceProfile
// route's), is no verdict. A cause that is an ErrEndpointTimeout is an
// [ErrTimeout] too.
var ErrEndpointTimeout = errors.New("classify: request timed out at its endpoint")

// EndpointTimedOut reports whether ctx, the context of a request to an
// endpoint, ended by a timeout that bounds the request at its endpoint
// ([ErrEndpointTimeout] as the cause): a failure of the endpoint, where a
// request its caller gave up is no verdict.
func EndpointTimedOut(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrEndpointTimeout)
}

// Abandoned reports whether the request whose context is ctx was given up
// by its caller: its context was cancelled (context.Canceled), and not by
// a timeout ([ErrTimeout] as the cause). A server's request context is
// cancelled so when its client closes the connection or resets the
// stream, a client's when the application cancels it. Linkerd's proxy
// records no response for such a request (the response future it drops
// records nothing), and neither do [NewHandler] and [NewTransport] when it
// was given up before a response head.
func Abandoned(ctx context.Context) bool {
	return errors.Is(ctx.Err(), context.Canceled) && !errors.Is(context.Cause(ctx), ErrTimeout)
}

// h2Codes are the HTTP/2 error code names, the only REASON values of an
// h2(REASON) label.
var h2Codes = map[string]bool{
	"NO_ERROR": true, "PROTOCOL_ERROR": true, "INTERNAL_ERROR": true, "FLOW_CONTROL_ERROR": true,
	"SETTINGS_TIMEOUT": true, "STREAM_CLOSED": true, "FRAME_SIZE_ERROR": true, "REFUSED_STREAM": true,
	"CANCEL": true, "COMPRESSION_ERROR": true, "CONNECT_ERROR": true, "ENHANCE_YOUR_CALM": true,
	"INADEQUATE_SECURITY": true, "HTTP_1_1_REQUIRED": true,
}

// ErrorClass classifies a failed exchange: ctx is the request's context,
// so that a cancellation caused by [ErrTimeout] (or a deadline) counts as a
// timeout.
func ErrorClass(ctx context.Context, err error) Class {
	c := Class{Failure: true, GRPCStatus: -1, Error: "unclassified"}
	switch {
	case errors.Is(err, ErrTimeout) || ctx != nil && errors.Is(context.Cause(ctx), ErrTimeout),
		errors.Is(err, context.DeadlineExceeded):
		c.Error = "timeout"
	default:
		if code := h2ErrorCode(err); code != "" {
			c.Error = "h2(" + code + ")"
		}
	}
	return c
}

// h2ErrorCode finds the HTTP/2 error code of a stream reset or GOAWAY, from
// x/net's StreamError or from the text of net/http's bundled errors.
func h2ErrorCode(err error) string {
	var se http2.StreamError
	if errors.As(err, &se) {
		return se.Code.String()
	}
	if err == nil {
		return ""
	}
	msg := err.Error()
	if i := strings.Index(msg, "stream error: stream ID "); i >= 0 {
		rest := msg[i:]
		if j := strings.Index(rest, "; "); j >= 0 {
			code := rest[j+2:]
			if k := strings.IndexAny(code, ";, )"); k >= 0 {
				code = code[:k]
			}
			if h2Codes[code] {
				return code
			}
		}
	}
	if i := strings.Index(msg, "ErrCode="); i >= 0 && strings.Contains(msg, "GOAWAY") {
		code := msg[i+len("ErrCode="):]
		if k := strings.IndexAny(code, ";, )"); k >= 0 {
			code = code[:k]
		}
		if h2Codes[code] {
			return code
		}
	}
	return ""
}
