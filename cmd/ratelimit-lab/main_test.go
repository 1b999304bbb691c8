package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestRunWritesOutputs runs the command on a tiny simulated cluster and
// checks that every output file is written.
func TestRunWritesOutputs(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-clock", "sim", "-nodes", "2", "-keys", "3", "-duration", "3s", "-limit", "10/1s", "-load", "2", "-out", dir, "-plot-format", "png"}))
	for _, f := range []string{"result.json", "summary.csv", "windows.csv", "latency.csv", "admitted.png", "latency.png"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		assert.Positive(t, st.Size(), f)
	}
	var res struct {
		Checks   int64 `json:"checks"`
		Accuracy struct {
			Sliding struct {
				Hits int64 `json:"hits"`
			} `json:"sliding"`
		} `json:"accuracy"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &res))
	assert.Equal(t, int64(3*20*3), res.Checks) // 3 keys x 20 hits/s x 3 s
	assert.Equal(t, res.Checks, res.Accuracy.Sliding.Hits)
}

func TestSweepWritesOutputs(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-clock", "sim", "-keys", "2", "-duration", "2s", "-sweep-nodes", "1,2", "-sweep-sync", "100ms,1s", "-out", dir}))
	for _, f := range []string{"sweep.json", "sweep.csv", "sweep.svg"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
	}
}

func TestMemoryMeasure(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-memkeys", "2000", "-out", dir}))
	_, err := os.Stat(filepath.Join(dir, "memory.json"))
	require.NoError(t, err)
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-limit", "nope"},
		{"-rate", "-3"},
		{"-clock", "moon"},
		{"-mode", "leaky"},
		{"-algorithm", "leaky"},
		{"-mode", "fixed", "-algorithm", "token_bucket"},
		{"-burst", "5"}, // sliding window: no burst
		{"-sweep-algorithms", "sliding_window,leaky"},
		{"-arrival", "bursty"},
		{"-strategy", "etcd"},
		{"-clock", "sim", "-rate", "max"},
		{"extra"},
	} {
		assert.Error(t, run(args), "%v", args)
	}
}

// -h prints the usage and exits 0; errors exit 1.
func TestHelpExitsZero(t *testing.T) {
	err := run([]string{"-h"})
	require.ErrorIs(t, err, flag.ErrHelp)
	assert.Equal(t, 0, exitCode(err))
	assert.Equal(t, 0, exitCode(nil))
	assert.Equal(t, 1, exitCode(run([]string{"-clock", "moon"})))
}

// TestAlgorithms runs each algorithm through the command on a tiny simulated
// cluster and checks the reference the result is judged against.
func TestAlgorithms(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, tc := range []struct {
		args    []string
		primary string
	}{
		{[]string{"-algorithm", "token_bucket", "-burst", "5"}, "bucket"},
		{[]string{"-algorithm", "gcra"}, "bucket"},
		{[]string{"-algorithm", "fixed_window"}, "fixed"},
		{[]string{"-mode", "fixed"}, "fixed"},
		{[]string{"-mode", "sliding"}, "sliding"},
		{[]string{"-algorithm", "sliding_log", "-sync-rate", "0"}, "sliding"},
		{[]string{"-algorithm", "sliding_log", "-sync-rate", "-1ms"}, "sliding"},
	} {
		dir := t.TempDir()
		args := append([]string{"-clock", "sim", "-nodes", "2", "-keys", "3", "-duration", "2s", "-limit", "10/1s", "-load", "2", "-out", dir}, tc.args...)
		require.NoError(t, run(args), "%v", tc.args)
		var res struct {
			Config struct {
				Algorithm string `json:"algorithm"`
				Burst     int64  `json:"burst"`
			} `json:"config"`
			Accuracy struct {
				Primary string `json:"primary"`
				Bucket  *struct {
					Reference string `json:"reference"`
					Hits      int64  `json:"hits"`
				} `json:"bucket"`
			} `json:"accuracy"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "result.json"))
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &res))
		assert.Equal(t, tc.primary, res.Accuracy.Primary, "%v", tc.args)
		if tc.primary == "bucket" {
			require.NotNil(t, res.Accuracy.Bucket)
			assert.Equal(t, "token-bucket", res.Accuracy.Bucket.Reference)
			assert.Equal(t, int64(3*20*2), res.Accuracy.Bucket.Hits)
			assert.Equal(t, "token_bucket", res.Config.Algorithm)
		} else {
			assert.Nil(t, res.Accuracy.Bucket)
		}
	}
}

// A sliding log with a periodic sync is refused by the library: the command
// fails with its error and says which modes work.
func TestSlidingLogPeriodicError(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	err := run([]string{"-clock", "sim", "-algorithm", "sliding_log", "-sync-rate", "100ms", "-duration", "1s"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refused by the library")
	assert.Contains(t, err.Error(), "use local or synchronous mode")
}

// TestSweepAlgorithms runs the SyncRate sweep for two algorithms and plots
// them together.
func TestSweepAlgorithms(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-clock", "sim", "-keys", "2", "-duration", "2s", "-sweep-nodes", "2", "-sweep-sync", "100ms,1s",
		"-sweep-algorithms", "sliding_window,token_bucket", "-burst", "50", "-out", dir}))
	b, err := os.ReadFile(filepath.Join(dir, "sweep.csv"))
	require.NoError(t, err)
	rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 5) // header + 2 algorithms x 2 SyncRates
	col := slices.Index(rows[0], "algorithm")
	burst := slices.Index(rows[0], "burst")
	require.Positive(t, col)
	var got []string
	for _, r := range rows[1:] {
		got = append(got, r[col]+"/"+r[burst])
	}
	assert.Equal(t, []string{"sliding_window/0", "sliding_window/0", "token_bucket/50", "token_bucket/50"}, got)
	svg, err := os.ReadFile(filepath.Join(dir, "sweep.svg"))
	require.NoError(t, err)
	assert.Contains(t, string(svg), "token_bucket, 2 nodes")
	assert.Contains(t, string(svg), "sliding_window, 2 nodes")
}

// TestFleet runs -fleet at a tiny size on the memory store (whose CPU the
// lab cannot measure: the CSV says -1) and checks its outputs.
func TestFleet(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	require.NoError(t, run([]string{"-fleet", "-clock", "sim", "-fleet-keys", "1000", "-fleet-rate", "300", "-fleet-nodes", "1,2", "-duration", "2s", "-out", dir}))
	b, err := os.ReadFile(filepath.Join(dir, "fleet.csv"))
	require.NoError(t, err)
	rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 3)
	col := func(name string) int {
		i := slices.Index(rows[0], name)
		require.GreaterOrEqual(t, i, 0, name)
		return i
	}
	assert.Equal(t, []string{"1", "2"}, []string{rows[1][col("nodes")], rows[2][col("nodes")]})
	assert.Equal(t, "1000", rows[1][col("keys")])
	assert.Equal(t, "-1", rows[1][col("store_cpu_per_sec")])
	assert.NotEqual(t, "0", rows[2][col("sync_cycles")])
	_, err = os.Stat(filepath.Join(dir, "fleet.svg"))
	require.NoError(t, err)

	assert.Error(t, run([]string{"-fleet", "-clock", "sim", "-fleet-nodes", "0"}))
	assert.Error(t, run([]string{"-fleet", "-clock", "sim", "-fleet-keys", "0"}))
	assert.ErrorContains(t, run([]string{"-fleet", "-clock", "sim", "-fleet-keys", "100", "-sync-rate", "0", "-duration", "1s"}), "periodic sync")
}
