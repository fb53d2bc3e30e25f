"""Before verl starts: is every node's reward server ours, and serving the run's databases?

verl's reward workers run on every node and call `reward.url` there (the recipes use 127.0.0.1, so each
node has its own server). A wrong server on one node would only show as failed scores mid-training, so
the check runs *on* each node of the Ray cluster -- one tiny task pinned to each -- before the launch.
"""

from __future__ import annotations

from rewards.identity import check_reward_server


def _problems_here(urls: list[str], db_root: str) -> list[str]:
    return [check.message for url in urls if not (check := check_reward_server(url, db_root)).ok]


def reward_server_problems(urls: list[str], db_root: str, ray_address: str | None, pythonpath: str) -> list[str]:
    """What is wrong with the reward servers, node by node ([] when every URL is ours for `db_root` everywhere).

    Without a Ray address verl starts a local Ray on this node, so this node is the only one to check.
    """
    if not ray_address:
        return _problems_here(urls, db_root)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from data_synthesis.ray_sampler import init_ray

    owned = not ray.is_initialized()
    if owned:
        init_ray(ray, address=ray_address, logging_level="ERROR", log_to_driver=False,
                      runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        check = ray.remote(num_cpus=0)(_problems_here)
        futures = [check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(urls, db_root) for n in nodes]
        found = ray.get(futures, timeout=120)
    finally:
        if owned:
            ray.shutdown()
    return [f"node {n['NodeManagerAddress']}: {problem}" for n, problems in zip(nodes, found) for problem in problems]
