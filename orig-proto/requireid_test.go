package origproto

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

type stubRoundTripper struct{ resp *http.Response }

func (s stubRoundTripper) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, nil }

// A request without l5d-require-id pays nothing for the header's check.
func TestRequireIDCheckAllocatesNothingWithoutTheHeader(t *testing.T) {
	tr := NewTransport(WithHTTP1(stubRoundTripper{&http.Response{StatusCode: 200, Body: http.NoBody}}))
	req := httptest.NewRequest("GET", "http://books.default.svc.cluster.local:7000/", nil)
	req.Header.Set("Accept", "text/plain")
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = tr.RoundTrip(req) }))
}
