package origproto_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	origproto "github.com/inmesh/inmesh/orig-proto"
)

// Two peers: the sender upgrades, the receiver restores HTTP/1.
func Example() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app saw %s, l5d-orig-proto %q", r.Proto, r.Header.Get("l5d-orig-proto"))
	})
	peer := httptest.NewUnstartedServer(nil)
	peer.Config = origproto.NewServer(origproto.NewHandler(app))
	peer.Start()
	defer peer.Close()

	tr := origproto.NewTransport(origproto.WithHint(func(*http.Request) bool { return true }))
	req, _ := http.NewRequest("GET", peer.URL+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Proto, string(body))
	// Output: HTTP/1.1 app saw HTTP/1.1, l5d-orig-proto ""
}
