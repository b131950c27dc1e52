package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/cpreplica"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/mesh"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// failover: requests that fail at the caller while a control-plane replica
// and an etcd member die together, as when the machine running both is
// lost. A three-member etcd cluster in this process; replica A reads the
// member that leads (its only endpoint), replica B all three; an outbound
// stack whose destination client has both (A first) sends requests from
// 16 workers to books; A and its member are killed; once etcd has a new
// leader, a second endpoint is applied and must reach the caller through
// B. The headline figure is the count of failed requests (goal 0), beside
// the total sent.
func failover(o options) (*result, error) {
	dir, err := os.MkdirTemp("", "bench-failover-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cluster, err := etcdtest.NewCluster(dir, 3)
	if err != nil {
		return nil, err
	}
	defer cluster.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	var apps []*httptest.Server
	app := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
		apps = append(apps, srv)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	defer func() {
		for _, s := range apps {
			s.Close()
		}
	}()
	a, b := app("a"), app("b")
	const prefix = "/bench"
	apply := func(addrs ...string) error {
		yaml := "- authority: " + books + "\n  endpoints:\n"
		for _, x := range addrs {
			yaml += "  - addr: " + x + "\n"
		}
		change := etcdstore.Change{Endpoints: []manifest.File{{Name: "books.yaml", Data: []byte(yaml)}}}
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := etcdstore.Apply(ctx, cli, prefix, change)
			cancel()
			if err == nil || time.Now().After(deadline) {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := apply(a); err != nil {
		return nil, err
	}
	lead := cluster.Leader()
	if lead < 0 {
		return nil, errors.New("the etcd cluster has no leader")
	}
	replicaA, err := cpreplica.Start([]string{cluster.Members[lead].Endpoint}, prefix, quiet)
	if err != nil {
		return nil, err
	}
	defer replicaA.Kill()
	replicaB, err := cpreplica.Start(cluster.Endpoints(), prefix, quiet)
	if err != nil {
		return nil, err
	}
	defer replicaB.Kill()
	dst, err := destination.Dial(replicaA.Addr+","+replicaB.Addr, destination.WithLogger(quiet),
		destination.WithBackoff(backoff.Policy{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond}))
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	client := mesh.NewClient(mesh.ClientOptions(mesh.WithDestination(dst), mesh.WithLogger(quiet))...)
	defer client.Close()

	var sent, failed atomic.Int64
	var sawB atomic.Bool
	send := func() (string, error) {
		resp, err := client.RoundTrip(get("http://"+books+"/", ""))
		if err != nil {
			return "", err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return string(body), err
	}
	// The first request, then the endpoint named by the control plane
	// answers (never a fallback to the name).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if body, err := send(); err == nil && body == "a" {
			break
		}
		if time.Now().After(deadline) {
			return nil, errors.New("books never answered through the control plane")
		}
		time.Sleep(10 * time.Millisecond)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				body, err := send()
				if err != nil {
					failed.Add(1)
					continue
				}
				if body == "b" {
					sawB.Store(true)
				}
			}
		}()
	}
	ended := false
	end := func() {
		if !ended {
			ended = true
			close(stop)
			wg.Wait()
		}
	}
	defer end()
	phase := time.Duration(o.scale(3000, 500)) * time.Millisecond
	t0 := time.Now()
	time.Sleep(phase)

	killed := time.Now()
	cluster.Kill(lead)
	replicaA.Kill()
	for {
		if l := cluster.Leader(); l >= 0 && l != lead {
			break
		}
		if time.Since(killed) > 30*time.Second {
			return nil, errors.New("etcd elected no new leader within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	elected := time.Since(killed)
	if err := apply(a, b); err != nil {
		return nil, fmt.Errorf("applying after the kills: %w", err)
	}
	applied := time.Now()
	for !sawB.Load() {
		if time.Since(applied) > 30*time.Second {
			return nil, errors.New("the endpoint applied after the kills did not reach the caller within 30s")
		}
		time.Sleep(time.Millisecond)
	}
	arrived := time.Since(applied)
	time.Sleep(phase)
	end()
	el := time.Since(t0)

	n, f := float64(sent.Load()), float64(failed.Load())
	r := &result{
		ratio:     ratio{Ratio: f, Goal: atMost(0), Spread: spread{f, f}},
		Unit:      "failed requests",
		Candidate: &figures{Requests: n, RPS: n / el.Seconds()},
		Rounds:    1,
	}
	r.Note = fmt.Sprintf("ratio = requests failed of %.0f sent by 16 workers while a replica and the etcd leader died; "+
		"new etcd leader after %v; the endpoint applied after the kills reached the caller %v after the write",
		n, elected.Round(time.Millisecond), arrived.Round(time.Millisecond))
	return r, nil
}
