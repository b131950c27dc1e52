package exchange

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type nopRecorder struct{}

func (nopRecorder) Attempt(context.Context)                         {}
func (nopRecorder) AttemptDone(context.Context, Outcome, time.Time) {}
func (nopRecorder) Done(context.Context, Outcome, time.Time)        {}

type provider struct{ c *classify.Classifier }

func (p provider) ResponseClassifier() *classify.Classifier { return p.c }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An exchange without timeouts or retries costs two allocations of its
// own (the exchange and the attempt's request), however the plan's
// Provider reaches the attempt's context, and the classifier is found there.
func TestRoundTripAllocations(t *testing.T) {
	c := &classify.Classifier{}
	p := &Plan{Provider: provider{c}, Recorder: nopRecorder{}}
	var seen *classify.Classifier
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = classify.FromContext(r.Context())
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	req, err := http.NewRequest("GET", "http://books:7000/books/1", nil)
	require.NoError(t, err)
	type key struct{}
	req = req.WithContext(context.WithValue(req.Context(), key{}, "parent"))
	resp, err := RoundTrip(base, req, p)
	require.NoError(t, err)
	assert.Same(t, c, seen, "the classifier is found in the attempt's context")
	assert.Equal(t, "parent", resp.Request.Context().Value(key{}), "the parent's values stay visible")
	assert.Nil(t, classify.FromContext(req.Context()), "the caller's request keeps its context")

	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := RoundTrip(base, req, p); err != nil {
			t.Fatal(err)
		}
	})
	// One more is the response the base returns.
	assert.LessOrEqual(t, allocs, 3.0)
}
