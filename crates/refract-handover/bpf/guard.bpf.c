/* refract backend guard (tc cls_bpf, direct action) on the agent host's interface.
 *
 * The agent host has the VIP on lo. A TCP segment to the VIP that is neither SYN nor RST and
 * matches no non-listening socket belongs to a flow this host does not own (yet, or any more):
 * the stack would answer it with RST and kill the client's connection, so it is dropped. Flows
 * in `tombstones` (being handed back) are dropped whatever they carry.
 *
 * It only ever drops: every other packet gets TC_ACT_UNSPEC (go on with the next filter, pass
 * if none), never TC_ACT_OK, which would end tc's chain and skip another program on the same
 * interface (a second agent's guard, whose tombstone may be the one that must drop a segment
 * its socket would still ACK, or a dispatcher's ingress program). */
#include "common.h"

/* The VIP in network order; set at load time. */
volatile const __u32 VIP = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* replaced at load time */
	__type(key, struct flow_key);
	__type(value, __u64); /* packets dropped */
} tombstones SEC(".maps");

/* 0: passed to an owning socket, 1: orphans dropped, 2: tombstoned drops. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} guard_stats SEC(".maps");

SEC("classifier") /* aya 0.13 knows tc programs by this section name */
int refract_guard(struct __sk_buff *skb)
{
	struct ethhdr *eth;
	struct iphdr *ip;
	struct tcphdr *th;

	if (!parse_tcp4(skb, &eth, &ip, &th) || ip->daddr != VIP)
		return TC_ACT_UNSPEC;
	struct flow_key k = {
		.saddr = ip->saddr, .daddr = ip->daddr, .sport = th->source, .dport = th->dest,
	};
	__u64 *tomb = bpf_map_lookup_elem(&tombstones, &k);
	if (tomb) {
		__sync_fetch_and_add(tomb, 1);
		bump(&guard_stats, 2);
		return TC_ACT_SHOT;
	}
	if (th->syn || th->rst)
		return TC_ACT_UNSPEC; /* new connections and resets: the stack decides */
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = ip->saddr;
	t.ipv4.daddr = ip->daddr;
	t.ipv4.sport = th->source;
	t.ipv4.dport = th->dest;
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (sk) {
		int listener = sk->state == BPF_TCP_LISTEN;

		bpf_sk_release(sk);
		if (!listener) {
			bump(&guard_stats, 0);
			return TC_ACT_UNSPEC;
		}
	}
	bump(&guard_stats, 1);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "GPL";
