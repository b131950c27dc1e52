// Command fleet runs a small fleet of inmesh in one process, on loopback:
// a three-member etcd cluster (etcd's embed package), two replicas of the
// embedded control plane over it, two services of three instances each,
// and two callers sending both services requests through inmesh's
// outbound stack, whose destination clients know both replicas. While the
// traffic flows, "machine 1" is lost: the control-plane replica on it, the
// etcd member on it (which leads the cluster) and a workload die at once.
// It then prints what the callers saw: requests and failures before and
// after, each instance's share of its service's answers, and how long the
// dead workload stayed in the answers.
//
//	go run ./examples/fleet                 # 3 s of traffic, the losses, 3 s more, the table
//	go run ./examples/fleet -duration 10s
//
// Each workload registers itself (package registration) through both
// replicas; its endpoint lives in etcd under a lease kept while its stream
// lives. The replicas take plaintext registrants here (insecure
// registration, for one machine); across machines, registration is over
// mTLS and bound to the manifests (see the README's Self-registration).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/examples/internal/cpreplica"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/manifest"
	"github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/registration"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// prefix is the etcd key prefix of the fleet's control plane.
const prefix = "/inmesh"

// manifests are the fleet's Services, applied to etcd as `destination
// apply -f` would.
const manifests = `apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec: {ports: [{port: 7000}]}
---
apiVersion: v1
kind: Service
metadata: {name: authors, namespace: default}
spec: {ports: [{port: 7001}]}
`

type options struct {
	duration  time.Duration // of the traffic before the losses, and after
	instances int           // per service
	workers   int           // per caller
	ttl       time.Duration // of the registrations' leases; 0: the default
}

func main() {
	o := options{}
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "traffic before the losses, and again after")
	flag.IntVar(&o.instances, "instances", 3, "instances of each service")
	flag.IntVar(&o.workers, "workers", 4, "concurrent requests of each of the two callers")
	flag.DurationVar(&o.ttl, "registration-ttl", etcdstore.DefaultRegistrationTTL, "the lease TTL of the registrations")
	flag.Parse()
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// workload is one instance of a service: an HTTP server on loopback that
// answers with its name.
type workload struct {
	name string
	svc  *service
	srv  *httptest.Server
	addr string
	dead atomic.Bool
	// conn carries the workload's registration: its stream lives as long
	// as the workload does.
	conn *grpc.ClientConn
	reg  *registration.Registration
}

// kill stops the workload as a crash would: its listener closes and every
// connection to it is cut.
func (w *workload) kill() {
	w.dead.Store(true)
	w.conn.Close() // its registration stream breaks, as with the process
	w.srv.Listener.Close()
	w.srv.CloseClientConnections()
	w.srv.Close()
}

// service is a service of the fleet and its instances.
type service struct {
	name      string
	authority string
	instances []*workload
}

// tally is what the callers saw in one phase: requests, failures, and
// answers by instance.
type tally struct {
	dead     string // the address of the workload that dies
	mu       sync.Mutex
	requests int64
	failures int64
	atDead   int64            // failures of requests sent to the dead workload
	answers  map[string]int64 // by instance name
	errs     map[string]int64 // by error text
}

func newTally(dead string) *tally {
	return &tally{dead: dead, answers: map[string]int64{}, errs: map[string]int64{}}
}

func (t *tally) add(body string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.requests++
	if err != nil {
		t.failures++
		if strings.Contains(err.Error(), t.dead) {
			t.atDead++
		}
		t.errs[err.Error()]++
		return
	}
	t.answers[body]++
}

func run(o options, out io.Writer) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	dir, err := os.MkdirTemp("", "inmesh-fleet-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// Three etcd members: machines 1, 2 and 3.
	cluster, err := etcdtest.NewCluster(dir, 3)
	if err != nil {
		return err
	}
	defer cluster.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := etcdstore.Apply(ctx, cli, prefix, etcdstore.Change{Manifests: []manifest.File{{Name: "fleet.yaml", Data: []byte(manifests)}}}); err != nil {
		return err
	}

	// Two control-plane replicas: A on machine 1 reads its local etcd
	// member only, B on machine 2 reads all three.
	lead := cluster.Leader()
	if lead < 0 {
		return errors.New("the etcd cluster has no leader")
	}
	machine1 := lead // machine 1 runs the member that leads etcd
	ttl := cmp.Or(o.ttl, etcdstore.DefaultRegistrationTTL)
	replicaA, err := cpreplica.Start([]string{cluster.Members[machine1].Endpoint}, prefix, log, cpreplica.WithInsecureRegistration(),
		cpreplica.WithRegistrationTTL(ttl))
	if err != nil {
		return err
	}
	defer replicaA.Kill()
	replicaB, err := cpreplica.Start(cluster.Endpoints(), prefix, log, cpreplica.WithInsecureRegistration(),
		cpreplica.WithRegistrationTTL(ttl))
	if err != nil {
		return err
	}
	defer replicaB.Kill()
	// The workloads, each registering itself through both replicas (B
	// first, as a workload on machine 2 would) and kept while its stream
	// lives; no endpoint is written by hand.
	services := []*service{
		{name: "books", authority: "books.default.svc.cluster.local:7000"},
		{name: "authors", authority: "authors.default.svc.cluster.local:7001"},
	}
	for _, svc := range services {
		for i := range o.instances {
			w := &workload{name: fmt.Sprintf("%s-%d", svc.name, i), svc: svc}
			name := w.name
			w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { io.WriteString(rw, name) }))
			w.addr = strings.TrimPrefix(w.srv.URL, "http://")
			defer w.srv.Close()
			if w.conn, err = registration.Dial(replicaB.Addr+","+replicaA.Addr, nil, ""); err != nil {
				return err
			}
			defer w.conn.Close()
			w.reg, err = registration.Register(ctx, w.conn, []registration.Endpoint{{
				Authority: svc.authority, Addr: netip.MustParseAddrPort(w.addr), Labels: map[string]string{"pod": w.name},
			}}, registration.WithLogger(log))
			if err != nil {
				return err
			}
			svc.instances = append(svc.instances, w)
		}
	}
	for _, svc := range services {
		for _, w := range svc.instances {
			select {
			case <-w.reg.Accepted():
			case <-time.After(30 * time.Second):
				return fmt.Errorf("%s: not registered within 30s: %v", w.name, w.reg.Err())
			}
		}
	}
	fmt.Fprintf(out, "etcd: 3 members (%s leads); control-plane replicas A %s (etcd %s only) and B %s (all members)\n",
		cluster.Members[machine1].Name, replicaA.Addr, cluster.Members[machine1].Name, replicaB.Addr)
	for _, svc := range services {
		var names []string
		for _, w := range svc.instances {
			names = append(names, w.name+" "+w.addr)
		}
		fmt.Fprintf(out, "%s: %s\n", svc.authority, strings.Join(names, ", "))
	}

	// Two callers, each with its own outbound stack and destination
	// client, given both replicas (A first).
	type caller struct {
		dst    *destination.Client
		client *mesh.Client
	}
	var callers []caller
	for range 2 {
		dst, err := destination.Dial(replicaA.Addr+","+replicaB.Addr, destination.WithLogger(log),
			destination.WithBackoff(backoff.Policy{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}))
		if err != nil {
			return err
		}
		defer dst.Close()
		c := mesh.NewClient(mesh.ClientOptions(mesh.WithDestination(dst), mesh.WithLogger(log))...)
		defer c.Close()
		callers = append(callers, caller{dst, c})
	}
	send := func(c *mesh.Client, authority string) (string, error) {
		req, _ := http.NewRequest("GET", "http://"+authority+"/", nil)
		resp, err := (&http.Client{Transport: c, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return string(body), err
	}
	// Each caller's first request to each service, on a fresh stack, is
	// answered by an instance the control plane named.
	for _, c := range callers {
		for _, svc := range services {
			body, err := send(c.client, svc.authority)
			if err != nil || !strings.HasPrefix(body, svc.name+"-") {
				return fmt.Errorf("the first request to %s: %q, %v", svc.authority, body, err)
			}
		}
	}

	// The victim, and when it leaves the answers the callers hold.
	victim := services[0].instances[min(1, o.instances-1)]
	var killedAt atomic.Pointer[time.Time]
	left := make(chan time.Duration, len(callers))
	for _, c := range callers {
		var once sync.Once
		stopWatch, err := c.dst.WatchEndpoints(ctx, victim.svc.authority, func(u endpoint.Update) {
			at := killedAt.Load()
			if at == nil || u.Set == nil {
				return
			}
			for _, e := range u.Set.Endpoints {
				if e.Addr.String() == victim.addr {
					return
				}
			}
			once.Do(func() { left <- time.Since(*at) })
		})
		if err != nil {
			return err
		}
		defer stopWatch()
	}

	// The traffic: both callers, o.workers each, every request to each
	// service in turn.
	phases := []*tally{newTally(victim.addr), newTally(victim.addr)}
	var phase atomic.Int32
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range callers {
		for w := range o.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// Counted in the phase it started in.
					p := phases[phase.Load()]
					body, err := send(c.client, services[i%len(services)].authority)
					p.add(body, err)
				}
			}()
		}
	}
	endTraffic := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer endTraffic()
	fmt.Fprintf(out, "traffic: 2 callers x %d workers, for %v; then machine 1 is lost: replica A, etcd %s and %s die; %v more\n",
		o.workers, o.duration, cluster.Members[machine1].Name, victim.name, o.duration)
	time.Sleep(o.duration)

	// The workload first: a request that starts once it is dead counts
	// after the losses (those in flight at its death, before).
	victim.kill()
	now := time.Now()
	killedAt.Store(&now)
	phase.Store(1)
	// The etcd member before the replica, whose Kill waits for its
	// goroutines.
	cluster.Kill(machine1)
	replicaA.Kill()
	time.Sleep(o.duration)
	endTraffic()

	// How long the victim stayed in each caller's answers.
	var gone []string
	var longest time.Duration
	for range callers {
		select {
		case d := <-left:
			gone = append(gone, d.Round(time.Millisecond).String())
			longest = max(longest, d)
		case <-time.After(ttl + 30*time.Second):
			gone = append(gone, "never")
			longest = ttl + 30*time.Second
		}
	}
	// Its replica revokes the lease when the stream breaks, before the
	// etcd leader dies or once there is a new one; else etcd, renewing
	// every lease at the election, lets the lease run its TTL.
	why := "its registration stream broke, and its replica revoked the lease"
	if longest >= ttl {
		why = fmt.Sprintf("its registration stream broke, but the etcd leader died with it: its lease ran its TTL, %v, from the new leader's election", ttl)
	}
	newLead := cluster.Leader()
	leadName := "none yet"
	if newLead >= 0 {
		leadName = cluster.Members[newLead].Name
	}
	fmt.Fprintln(out)
	printTable(out, services, phases, victim)
	fmt.Fprintf(out, "\n%s left the answers each caller holds %s after it died (%s)\n", victim.name, strings.Join(gone, " and "), why)
	fmt.Fprintf(out, "etcd after the loss: %s leads\n", leadName)
	errs := map[string]int64{}
	for _, p := range phases {
		for e, n := range p.errs {
			errs[e] += n
		}
	}
	for _, e := range slices.Sorted(maps.Keys(errs)) {
		fmt.Fprintf(out, "failure: %d x %s\n", errs[e], e)
	}
	return nil
}

// printTable prints the requests and failures of both phases, then each
// instance's share of its service's answers before and after the losses.
func printTable(out io.Writer, services []*service, phases []*tally, victim *workload) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "requests started\tbefore the losses\tafter the losses")
	fmt.Fprintf(tw, "sent\t%d\t%d\n", phases[0].requests, phases[1].requests)
	fmt.Fprintf(tw, "failed\t%d\t%d\n", phases[0].failures, phases[1].failures)
	fmt.Fprintf(tw, "  sent to the dead workload\t%d\t%d\n", phases[0].atDead, phases[1].atDead)
	for _, svc := range services {
		var total [2]int64
		for i, p := range phases {
			for _, w := range svc.instances {
				total[i] += p.answers[w.name]
			}
		}
		for _, w := range svc.instances {
			note := ""
			if w == victim {
				note = " (killed)"
			}
			share := func(i int) string {
				if total[i] == 0 {
					return "-"
				}
				return fmt.Sprintf("%.1f%% (%d)", 100*float64(phases[i].answers[w.name])/float64(total[i]), phases[i].answers[w.name])
			}
			fmt.Fprintf(tw, "%s%s\t%s\t%s\n", w.name, note, share(0), share(1))
		}
	}
	tw.Flush()
}
