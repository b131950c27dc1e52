package router_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/inmesh/inmesh/classify"
	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
)

// A router over a ServiceProfile: Explain says which route a request takes
// and what applies to it, and the Transport routes it, here to a server on
// loopback named by the request's Host.
func ExampleRouter_Explain() {
	sps, err := profiles.ParseServiceProfiles([]byte(`
apiVersion: linkerd.io/v1alpha2
kind: ServiceProfile
metadata: {name: books.shop.svc.cluster.local}
spec:
  routes:
  - name: GET /books/{id}
    condition: {method: GET, pathRegex: '/books/[^/]+'}
    isRetryable: true
    timeout: 300ms
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	const books = "books.shop.svc.cluster.local:7000"
	src := profiles.NewStaticSource(map[string]*profiles.Profile{books: sps[0].ProfileFor(7000)})
	r := router.New(router.WithProfiles(src))
	defer r.Close()

	req := httptest.NewRequest("GET", "http://"+books+"/books/12", nil)
	// Discovery never blocks a request: the first one to an authority starts
	// its watch and takes the default route; the profile applies once in.
	r.Explain(req)
	e := r.Explain(req)
	for deadline := time.Now().Add(10 * time.Second); e.Route == "" && time.Now().Before(deadline); e = r.Explain(req) {
		time.Sleep(time.Millisecond)
	}
	fmt.Println(e.Model, e.Route)

	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "book "+strings.TrimPrefix(r.URL.Path, "/books/"))
	}))
	defer app.Close()
	// The base transport sends each attempt to the app, whatever its host.
	base := roundTripper(func(req *http.Request) (*http.Response, error) {
		req = req.Clone(req.Context())
		req.URL.Host = strings.TrimPrefix(app.URL, "http://")
		return http.DefaultTransport.RoundTrip(req)
	})
	resp, err := (&http.Client{Transport: r.Transport(base)}).Get("http://" + books + "/books/12")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// serviceprofile GET /books/{id}
	// 200 book 12
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// One router serves both sides of a service: its Transport routes, times
// out and retries the application's outbound requests; its Handler routes
// and records the inbound requests for the service's own authority, while
// requests naming any other Host take the default route.
func ExampleRouter_Handler() {
	budget := profiles.DefaultRetryBudget()
	src := profiles.NewStaticSource(map[string]*profiles.Profile{
		"books.default.svc.cluster.local:7000": {
			Routes: []profiles.Route{{
				Condition: profiles.MatchAll{profiles.Method("GET"), profiles.PathRegex("/books/[^/]+")},
				Labels:    map[string]string{"route": "GET /books/{id}"},
				Retryable: true,
				Timeout:   time.Second,
			}},
			RetryBudget: &budget,
		},
	})
	r := router.New(router.WithProfiles(src), router.WithLocalAuthorities("books.default.svc.cluster.local:7000"))
	defer r.Close()
	client := &http.Client{Transport: r.Transport(classify.NewTransport(nil))}
	handler := r.Handler(classify.NewHandler(http.NotFoundHandler()))
	_, _ = client, handler
}
