package balancer_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/profiles"
)

// A balancer without a control plane: endpoints from a static source, a
// traffic split from a static profile.
func ExampleNew() {
	v2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "v2 answered for %s", r.Host)
	}))
	defer v2.Close()
	src, err := balancer.NewStaticSource(map[string][]endpoint.Endpoint{
		"books-v2.default.svc.cluster.local:7000": {{Addr: netip.MustParseAddrPort(strings.TrimPrefix(v2.URL, "http://"))}},
		"books.default.svc.cluster.local:7000":    {}, // no endpoints of its own
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	profs := profiles.NewStaticSource(map[string]*profiles.Profile{
		"books.default.svc.cluster.local:7000": {DstOverrides: []endpoint.WeightedDst{
			{Authority: "books-v2.default.svc.cluster.local:7000", Weight: 10000},
		}},
	})
	// books has no endpoints: a request sent to it waits in its queue
	// for some, here at most 100 ms, then fails fast.
	b := balancer.New(src, balancer.WithSplits(profiles.Splits(profs)), balancer.WithQueue(0, 100*time.Millisecond))
	defer b.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: b.Transport(tr)}

	// The profile may not be known for the very first request, which then
	// goes to books itself; a few requests later the split is in force.
	var body []byte
	for range 100 {
		resp, err := client.Get("http://books.default.svc.cluster.local:7000/books/1")
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(string(body))
	// Output: v2 answered for books.default.svc.cluster.local:7000
}
