// Command ratelimit-policy validates, compares, publishes and rolls back
// rate-limit policies (see package policy):
//
//	ratelimit-policy validate FILE...
//	ratelimit-policy diff OLD NEW          compare two files
//	ratelimit-policy diff STORE NEW        compare the store's current version with a file
//	ratelimit-policy publish STORE FILE    validate, then publish as the new version
//	ratelimit-policy rollback STORE [-to N]
//	ratelimit-policy show STORE            the current version and the versions kept
//
// STORE is one of: -redis ADDR [-prefix P], -postgres DSN [-table T], -file
// PATH, -url URL (an operator handler, policy.NewHandler, mounted at URL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/ratelimit/policy"
	"github.com/ratesync/ratelimit/policy/pgstore"
	"github.com/ratesync/ratelimit/policy/redisstore"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  ratelimit-policy validate FILE...
  ratelimit-policy diff [STORE] OLD|NEW [NEW]
  ratelimit-policy publish STORE FILE
  ratelimit-policy rollback STORE [-to N]
  ratelimit-policy show STORE
STORE: -redis ADDR [-prefix P] | -postgres DSN [-table T] | -file PATH | -url URL
`

// run is the command; it returns the exit status: 0 success, 1 a bad
// document or a failed operation, 2 bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisAddr := fs.String("redis", "", "Redis address (host:port)")
	prefix := fs.String("prefix", "", "Redis key prefix (default ratelimit:policy)")
	dsn := fs.String("postgres", "", "PostgreSQL DSN")
	table := fs.String("table", "", "PostgreSQL table (default ratelimit_policy)")
	file := fs.String("file", "", "policy file")
	url := fs.String("url", "", "operator handler URL")
	to := fs.Int64("to", 0, "rollback: the version to make current (default: the previous one)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on the whole operation")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	open := func() (policy.Store, func(), error) {
		return openStore(ctx, *redisAddr, *prefix, *dsn, *table, *file, *url)
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, err)
		return 1
	}
	rest := fs.Args()
	switch cmd {
	case "validate":
		if len(rest) == 0 {
			fmt.Fprint(stderr, usage)
			return 2
		}
		status := 0
		for _, f := range rest {
			if _, err := readDoc(f); err != nil {
				fmt.Fprintf(stderr, "%s:\n%v\n", f, err)
				status = 1
				continue
			}
			fmt.Fprintf(stdout, "%s: ok\n", f)
		}
		return status
	case "diff":
		var old *policy.Document
		switch {
		case len(rest) == 2:
			d, err := readDoc(rest[0])
			if err != nil {
				return fail(fmt.Errorf("%s:\n%w", rest[0], err))
			}
			old, rest = d, rest[1:]
		case len(rest) == 1:
			st, done, err := open()
			if err != nil {
				return fail(err)
			}
			defer done()
			old, err = currentDoc(ctx, st)
			if err != nil {
				return fail(err)
			}
		default:
			fmt.Fprint(stderr, usage)
			return 2
		}
		nw, err := readDoc(rest[0])
		if err != nil {
			return fail(fmt.Errorf("%s:\n%w", rest[0], err))
		}
		for _, l := range policy.Diff(old, nw) {
			fmt.Fprintln(stdout, l)
		}
		return 0
	case "publish":
		if len(rest) != 1 {
			fmt.Fprint(stderr, usage)
			return 2
		}
		data, err := os.ReadFile(rest[0])
		if err != nil {
			return fail(err)
		}
		st, done, err := open()
		if err != nil {
			return fail(err)
		}
		defer done()
		n, err := policy.Publish(ctx, st, data, nil)
		if err != nil {
			return fail(fmt.Errorf("%s: not published:\n%w", rest[0], err))
		}
		fmt.Fprintf(stdout, "published version %d\n", n)
		return 0
	case "rollback":
		st, done, err := open()
		if err != nil {
			return fail(err)
		}
		defer done()
		n := *to
		if n > 0 {
			err = st.SetCurrent(ctx, n)
		} else {
			n, err = policy.Rollback(ctx, st)
		}
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "current version %d\n", n)
		return 0
	case "show":
		st, done, err := open()
		if err != nil {
			return fail(err)
		}
		defer done()
		n, err := st.Current(ctx)
		if err != nil {
			return fail(err)
		}
		vs, err := st.Versions(ctx)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "current version %d; versions kept %v\n", n, vs)
		if n > 0 {
			v, err := st.Get(ctx, n)
			if err != nil {
				return fail(err)
			}
			_, _ = stdout.Write(v.Doc)
		}
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

func readDoc(path string) (*policy.Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return policy.Parse(data)
}

func currentDoc(ctx context.Context, st policy.Store) (*policy.Document, error) {
	n, err := st.Current(ctx)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return &policy.Document{}, nil
	}
	v, err := st.Get(ctx, n)
	if err != nil {
		return nil, err
	}
	return policy.Parse(v.Doc)
}

// openStore opens the one store the flags name and returns a function that
// releases it.
func openStore(ctx context.Context, redisAddr, prefix, dsn, table, file, url string) (policy.Store, func(), error) {
	set := 0
	for _, s := range []string{redisAddr, dsn, file, url} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		return nil, nil, errors.New("give exactly one store: -redis, -postgres, -file or -url")
	}
	switch {
	case redisAddr != "":
		c := goredis.NewClient(&goredis.Options{
			Addr:                  redisAddr,
			MaxRetries:            -1, // an Append must not be applied twice
			DialTimeout:           3 * time.Second,
			ReadTimeout:           3 * time.Second,
			WriteTimeout:          3 * time.Second,
			PoolTimeout:           4 * time.Second,
			MinRetryBackoff:       -1,
			MaxRetryBackoff:       -1,
			ContextTimeoutEnabled: true,
		})
		return redisstore.New(c, redisstore.Options{Prefix: prefix}), func() { _ = c.Close() }, nil
	case dsn != "":
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return nil, nil, err
		}
		s, err := pgstore.New(ctx, pool, pgstore.Options{Table: table})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	case file != "":
		return policy.NewFileStore(file), func() {}, nil
	}
	return &httpStore{base: url}, func() {}, nil
}
