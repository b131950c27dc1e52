package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A three-member cluster keeps serving reads and writes when its leader is
// killed: the client moves to a live member, a new leader is elected, and
// what was written before the kill is still there. The killed member's
// client URL refuses requests.
func TestClusterSurvivesAKilledLeader(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, "/k", "before")
	require.NoError(t, err)

	leader := c.Leader()
	require.NotEqual(t, -1, leader)
	c.Kill(leader)
	assert.NotEqual(t, leader, c.Leader(), "a killed member is never named the leader")
	require.Eventually(t, func() bool { l := c.Leader(); return l != -1 && l != leader }, 30*time.Second, 10*time.Millisecond, "a new leader")
	// Writes may fail while the election runs; a user retries.
	require.Eventually(t, func() bool {
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := cli.Put(short, "/k2", "after")
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)
	resp, err := cli.Get(ctx, "/k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	assert.Equal(t, "before", string(resp.Kvs[0].Value))

	dead, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Members[leader].Endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer dead.Close()
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	_, err = dead.Get(short, "/k")
	assert.Error(t, err, "the killed member answers nothing")
}
