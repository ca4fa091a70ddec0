"""A pacs reward as a TRL GRPOTrainer reward function, called here the way the trainer calls it."""
import os
from pathlib import Path

from pacs.captioner.data import load_dataset
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.rewards.trl import reward_function

items = load_dataset("flickr8k", Path(os.environ["PACS_SHARED"]) / "data" / "flickr8k").split("train").items[:2]
# the dataset GRPOTrainer would get: a prompt, the image (path or PIL) and the references of each image
dataset = {"prompt": [[{"role": "user", "content": "Describe the image."}] for _ in items],
           "image": [str(item.image_path) for item in items],
           "references": [list(item.captions) for item in items]}

backbone = build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")  # or checkpoint="PAC++_...pth"
pacs_reward = reward_function("cider:1,ref-pac-s++:0.5", backbone=backbone, train_references=dataset["references"])
# trainer = GRPOTrainer(model=..., reward_funcs=[pacs_reward], train_dataset=Dataset.from_dict(dataset), ...)

# one GRPO batch: each prompt's row repeated num_generations = 2 times, one completion each
rows = [0, 0, 1, 1]
completions = [[{"role": "assistant", "content": text}] for text in
               ["a dog runs through the grass", "a man", "two children play in a fountain", "a red car"]]
values = pacs_reward(prompts=[dataset["prompt"][r] for r in rows], completions=completions,
                     completion_ids=[[0]] * len(rows), trainer_state=None,
                     image=[dataset["image"][r] for r in rows], references=[dataset["references"][r] for r in rows])
print(f"TRL logs it as rewards/{pacs_reward.__name__}/mean")
for row, completion, value in zip(rows, completions, values):
    print(f"image {row}: {completion[0]['content']!r:35} reward {value:.4f}")
print(f"images encoded: {pacs_reward.n_encoded} (for {len(rows)} completions)")
