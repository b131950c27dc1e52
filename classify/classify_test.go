package classify

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type status struct{ lo, hi int }

func (s status) MatchStatus(c int) bool { return c >= s.lo && c <= s.hi }

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestClassifier(t *testing.T) {
	routeClasses := &Classifier{Classes: []ResponseClass{
		{Match: status{533, 533}, Failure: false},
		{Match: status{500, 599}, Failure: true},
		{Match: status{404, 404}, Failure: true},
	}}
	legacy := &Classifier{LegacyGRPC: true}
	// grpcOpen is a gRPC call that ended without a status: classify.rs's
	// Eos::GrpcOpen ends as Grpc(Ok(Unknown)), a success labelled
	// grpc_status="2", and no status for retries to read.
	grpcOpen := Class{GRPCStatus: -1, NoGRPCStatus: true}
	tests := []struct {
		name     string
		c        *Classifier
		grpc     bool
		status   int
		header   http.Header
		trailers http.Header
		want     Class
	}{
		{"default 200", nil, false, 200, nil, nil, success},
		{"default 404 is success", nil, false, 404, nil, nil, success},
		{"default 500", nil, false, 500, nil, nil, failure},
		{"default 599", nil, false, 599, nil, nil, failure},
		{"default ignores trailers", nil, false, 200, nil, hdr("Grpc-Status", "14"), success},
		{"route class first match wins", routeClasses, false, 533, nil, nil, success},
		{"route class failure", routeClasses, false, 502, nil, nil, failure},
		{"route class 404 failure", routeClasses, false, 404, nil, nil, failure},
		{"route class miss: gRPC header", routeClasses, false, 200, hdr("Grpc-Status", "13"), nil, Class{Failure: true, GRPCStatus: 13}},
		{"route class miss: gRPC trailer", routeClasses, false, 200, nil, hdr("Grpc-Status", "14"), Class{Failure: true, GRPCStatus: 14}},
		{"route class miss: http", routeClasses, false, 200, nil, nil, success},
		{"grpc trailers-only failure", nil, true, 200, hdr("Grpc-Status", "14"), nil, Class{Failure: true, GRPCStatus: 14}},
		{"grpc trailer failure", nil, true, 200, nil, hdr("Grpc-Status", "4"), Class{Failure: true, GRPCStatus: 4}},
		{"grpc not found is success", nil, true, 200, nil, hdr("Grpc-Status", "5"), Class{GRPCStatus: 5}},
		{"grpc invalid argument is success", nil, true, 200, nil, hdr("Grpc-Status", "3"), Class{GRPCStatus: 3}},
		{"grpc permission denied fails", nil, true, 200, nil, hdr("Grpc-Status", "7"), Class{Failure: true, GRPCStatus: 7}},
		{"grpc ok", nil, true, 200, nil, hdr("Grpc-Status", "0"), Class{GRPCStatus: 0}},
		{"grpc no status is success", nil, true, 200, nil, nil, grpcOpen},
		{"grpc unparsable status is absent", nil, true, 200, nil, hdr("Grpc-Status", "x"), grpcOpen},
		// classify.rs grpc_code: a u16, then tonic's Code::from_i32, which
		// makes any code past 16 Unknown.
		{"grpc status past 16 is unknown, a failure", nil, true, 200, nil, hdr("Grpc-Status", "99"), Class{Failure: true, GRPCStatus: 2}},
		{"grpc status past 16 in the head", nil, true, 200, hdr("Grpc-Status", "17"), nil, Class{Failure: true, GRPCStatus: 2}},
		{"grpc status past 16 bits is absent", nil, true, 200, nil, hdr("Grpc-Status", "65536"), grpcOpen},
		{"grpc negative status is absent", nil, true, 200, nil, hdr("Grpc-Status", "-1"), grpcOpen},
		// linkerd2-proxy linkerd/app/core/src/classify.rs: a gRPC call
		// without a route's classes is classified by grpc-status alone
		// (Response::Grpc); without one it is Ok(Unknown), a success,
		// whatever the HTTP status (Eos::GrpcOpen).
		{"grpc 503 without status is a success", nil, true, 503, nil, nil, grpcOpen},
		{"grpc 503 with a failing trailer", nil, true, 503, nil, hdr("Grpc-Status", "14"), Class{Failure: true, GRPCStatus: 14}},
		{"grpc 500 with status 0 in the head", nil, true, 500, hdr("Grpc-Status", "0"), nil, Class{GRPCStatus: 0}},
		// classify.rs: a plain HTTP request without a route's classes is
		// classified by its status alone (Response::Http); grpc-status
		// in the head is not read.
		{"plain request ignores grpc-status in the head", nil, false, 200, hdr("Grpc-Status", "14"), nil, success},
		{"plain request 500 with grpc-status 0", nil, false, 500, hdr("Grpc-Status", "0"), nil, failure},
		{"legacy: plain request ignores grpc-status", legacy, false, 200, hdr("Grpc-Status", "5"), nil, success},
		{"legacy: grpc 503 without status fails", legacy, true, 503, nil, nil, Class{Failure: true, GRPCStatus: 0}},
		// The tests of classify.rs, by name.
		{"classify.rs http_response_status_ok", nil, false, 200, nil, nil, success},
		{"classify.rs http_response_status_bad_request", nil, false, 400, nil, nil, success},
		{"classify.rs http_response_status_server_error", nil, false, 500, nil, nil, failure},
		{"classify.rs grpc_response_header_ok", nil, true, 200, hdr("Grpc-Status", "0"), nil, Class{GRPCStatus: 0}},
		{"classify.rs grpc_response_header_error", nil, true, 200, hdr("Grpc-Status", "2"), nil, Class{Failure: true, GRPCStatus: 2}},
		{"classify.rs grpc_response_trailer_ok", nil, true, 200, nil, hdr("Grpc-Status", "0"), Class{GRPCStatus: 0}},
		{"classify.rs grpc_response_trailer_error", nil, true, 200, nil, hdr("Grpc-Status", "4"), Class{Failure: true, GRPCStatus: 4}},
		{"classify.rs grpc_response_trailer_missing", nil, true, 200, nil, http.Header{}, grpcOpen},
		{"classify.rs grpc_over_http_trailer_ok", nil, true, 200, nil, hdr("Grpc-Status", "0"), Class{GRPCStatus: 0}},
		{"classify.rs grpc_over_http_trailer_error", nil, true, 200, nil, hdr("Grpc-Status", "4"), Class{Failure: true, GRPCStatus: 4}},
		{"classify.rs profile_without_response_match_falls_back_to_grpc", routeClasses, true, 200, nil, hdr("Grpc-Status", "4"), Class{Failure: true, GRPCStatus: 4}},
		{"legacy: every non-zero code fails", legacy, true, 200, nil, hdr("Grpc-Status", "5"), Class{Failure: true, GRPCStatus: 5}},
		{"legacy: no status fails", legacy, true, 200, nil, nil, Class{Failure: true, GRPCStatus: 0}},
		{"custom codes", &Classifier{GRPCFailureCodes: []int32{5}}, true, 200, nil, hdr("Grpc-Status", "14"), Class{GRPCStatus: 14}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, final := tt.c.Head(tt.grpc, tt.status, tt.header)
			if !final {
				c = tt.c.End(c, tt.grpc, tt.trailers)
			}
			assert.Equal(t, tt.want, c)
			// The handler side reads trailers one by one.
			c2, final := tt.c.Head(tt.grpc, tt.status, tt.header)
			if !final {
				v, ok := tt.trailers["Grpc-Status"]
				first := ""
				if ok {
					first = v[0]
				}
				c2 = tt.c.EndStatus(c2, tt.grpc, first, ok)
			}
			assert.Equal(t, tt.want, c2)
			if tt.want.NoGRPCStatus {
				assert.Equal(t, int32(2), c.GRPCStatusLabel(), "Unknown, as classify.rs")
			} else {
				assert.Equal(t, tt.want.GRPCStatus, c.GRPCStatusLabel())
			}
		})
	}
}

func TestErrorClass(t *testing.T) {
	cancelled, cancel := context.WithCancelCause(context.Background())
	cancel(ErrTimeout)
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{"timeout cause", cancelled, context.Canceled, "timeout"},
		{"deadline", context.Background(), fmt.Errorf("dial: %w", context.DeadlineExceeded), "timeout"},
		{"x/net stream reset", context.Background(), http2.StreamError{StreamID: 3, Code: http2.ErrCodeCancel}, "h2(CANCEL)"},
		{"net/http stream error text", context.Background(), errors.New("stream error: stream ID 5; REFUSED_STREAM; received from peer"), "h2(REFUSED_STREAM)"},
		{"net/http goaway text", context.Background(), errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=PROTOCOL_ERROR, debug=\"\""), "h2(PROTOCOL_ERROR)"},
		{"unknown code stays bounded", context.Background(), errors.New("stream error: stream ID 5; EVIL_CODE"), "unclassified"},
		{"other", context.Background(), errors.New("connection refused"), "unclassified"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ErrorClass(tt.ctx, tt.err)
			assert.True(t, c.Failure)
			assert.Equal(t, int32(-1), c.GRPCStatus)
			assert.Equal(t, tt.want, c.Error)
		})
	}
}
