// Command app is the plain HTTP/1 books service of inmesh's examples. It
// knows nothing of the mesh; it reports what it saw of each request in
// response headers, so that a test can check what the mesh delivered.
//
//	go run ./examples/app -listen 127.0.0.1:8080
//
// Routes: GET /books, GET /books/{id}, POST /books, GET /flaky (fails every
// other call with 503), GET /slow (answers after -slow).
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/inmesh/inmesh/examples/internal/booksapp"
	origproto "github.com/inmesh/inmesh/orig-proto"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on (HTTP/1 only)")
	slow := flag.Duration("slow", 2*time.Second, "how long GET /slow takes")
	flag.Parse()
	srv := &http.Server{Handler: booksapp.Handler(*slow), ReadHeaderTimeout: 10 * time.Second}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", lis.Addr())
	// Requests with ambiguous framing are refused before the handler.
	log.Fatal(srv.Serve(origproto.GuardListener(lis)))
}
