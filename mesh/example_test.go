package mesh_test

import (
	"net/http"

	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/profiles"
)

func ExampleNewClient() {
	// Without a destination client, profiles come from the source given and
	// requests go to their own address.
	client := mesh.NewClient(mesh.WithProfiles(profiles.NewStaticSource(nil)))
	defer client.Close()
	httpClient := &http.Client{Transport: client}
	_ = httpClient
}

func ExampleNewServer() {
	app := http.NotFoundHandler()
	server := mesh.NewServer(app)
	defer server.Close()
	_ = server // serve it with origproto.NewServer(server)
}
