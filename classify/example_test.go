package classify_test

import (
	"fmt"
	"net/http"

	"github.com/inmesh/inmesh/classify"
)

func ExampleClassifier() {
	var c classify.Classifier // the default rules
	class, final := c.Head(false, 503, nil)
	fmt.Println(class.Classification(), final)

	// A gRPC call: the status comes in the trailers.
	class, final = c.Head(true, 200, http.Header{})
	class = c.End(class, true, http.Header{"Grpc-Status": {"14"}})
	fmt.Println(class.Classification(), final, class.GRPCStatus)
	// Output:
	// failure true
	// failure false 14
}

func ExampleNewHandler() {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	// Records request_total, response_total and response_latency_ms with
	// direction="inbound" into the global MeterProvider.
	var h http.Handler = classify.NewHandler(app)
	_ = h
}
