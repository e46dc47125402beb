"""Runs vLLM's own ZmqEventPublisher (loaded as gen.py loads it, without
torch) for TestVLLMPublisherWarmRestart.

    publisher.py PUB_IPC_PATH PAYLOAD_LOG N

Binds the PUB on ipc://PUB_IPC_PATH and the replay ROUTER on a free
loopback port, publishes N batches before anyone subscribes (they live only
in the replay buffer, buffer_steps=N, vLLM's default of 10,000 in the test),
prints "ready <replay endpoint>", then keeps publishing a batch every 5ms
until a line arrives on stdin, prints "stopped <last seq>", and exits at
stdin EOF. Every payload is appended, as hex, to PAYLOAD_LOG in sequence
order: the reference the router's view is compared with.
"""
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    ipc, log_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    path, _ = gen.locate()
    kv = gen.load(path)
    import msgspec

    replay = f"tcp://127.0.0.1:{free_port()}"
    pub = kv.ZmqEventPublisher(0, endpoint=f"ipc://{ipc}", replay_endpoint=replay, buffer_steps=n + 20000, topic="kv@t@m")
    enc = msgspec.msgpack.Encoder()
    rnd = random.Random(7)
    bs = 4
    chains = []  # [hashes, tokens] of stored prompts
    next_hash = [1]
    log = open(log_path, "w")

    def batch():
        evs = []
        for _ in range(1 + rnd.randrange(3)):
            if chains and rnd.random() < 0.3:
                hs, toks = chains[rnd.randrange(len(chains))]
                if hs:
                    evs.append(kv.BlockRemoved(block_hashes=[hs.pop()], medium="GPU", group_idx=0))
                    continue
            k = 1 + rnd.randrange(4)
            toks = [rnd.randrange(150000) for _ in range(k * bs)]
            hs = list(range(next_hash[0], next_hash[0] + k))
            next_hash[0] += k
            chains.append([list(hs), toks])
            evs.append(kv.BlockStored(block_hashes=hs, parent_block_hash=None, token_ids=toks, block_size=bs,
                                      lora_id=None, medium="GPU", lora_name=None, group_idx=0))
        # The rank publish() would stamp, so that the log holds the bytes sent.
        b = kv.KVEventBatch(ts=time.time(), events=evs, data_parallel_rank=0)
        log.write(enc.encode(b).hex() + "\n")
        return b

    for _ in range(n):
        b = batch()
        pub.publish(b)
    pub._event_queue.join()
    print("ready", replay, flush=True)

    stop = threading.Event()

    def reader():
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=reader, daemon=True).start()
    while not stop.is_set():
        pub.publish(batch())
        time.sleep(0.005)
    pub._event_queue.join()
    log.flush()
    print("stopped", flush=True)
    sys.stdin.read()
    pub.shutdown()


if __name__ == "__main__":
    main()
