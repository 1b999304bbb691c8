package faultproxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ratesync/ratelimit/internal/faultproxy"
)

// A proxy in front of a server: the client talks to p.Addr() instead. Here the
// server echoes lines; in a test it would be Redis or PostgreSQL.
func Example() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()

	p, err := faultproxy.New(ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer p.Close()

	ask := func(line string) string {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return "dial: " + err.Error()
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		fmt.Fprintln(c, line)
		ans, err := bufio.NewReader(c).ReadString('\n')
		if err, ok := err.(net.Error); ok && err.Timeout() {
			return "timeout"
		}
		if err != nil {
			return "closed"
		}
		return ans[:len(ans)-1]
	}

	fmt.Println(ask("hello"))

	p.SetMode(faultproxy.BlackHole) // the server seems to hang
	fmt.Println(ask("anyone?"))
	p.SetMode(faultproxy.Forward)

	// Cut the next request that contains "write", once the server answered.
	p.Arm(faultproxy.Cut{Match: func(b []byte) bool { return bytes.Contains(b, []byte("write")) }})
	fmt.Println(ask("write x"), p.Cuts())

	// Output:
	// hello
	// timeout
	// closed 1
}
