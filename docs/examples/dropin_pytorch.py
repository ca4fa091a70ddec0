"""pacs in a plain PyTorch loop: a pacs reward trains a toy captioner, `pacs.metric.score` evaluates it."""
import torch
from PIL import Image

from pacs.metric import score
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.rewards import build_reward

torch.manual_seed(0)
# a tiny random CLIP stands in for the reward model; use load_backbone(checkpoint="PAC++_clip_ViT-B-32.pth")
backbone = build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")
images = {"red": Image.new("RGB", (64, 64), (220, 20, 20)), "blue": Image.new("RGB", (64, 64), (20, 40, 220))}
references = {"red": ["a red square", "a red image"], "blue": ["a blue square", "a blue image"]}
pool = ["a red square", "a blue square", "a dog on the grass", "a plate of food", "two people walking"]

# the "captioner": one learnable distribution over the caption pool per image
logits = torch.zeros(len(images), len(pool), requires_grad=True)
optimizer = torch.optim.SGD([logits], lr=20.0)
reward = build_reward("ref-pac-s++", backbone=backbone, image_loader=images.__getitem__)
image_ids, k = list(images), 4
refs = [references[image_id] for image_id in image_ids]
for step in range(30):
    policy = torch.distributions.Categorical(logits=logits)
    picks = policy.sample((k,)).T                                       # [B, k] caption indices
    captions = [[pool[j] for j in row] for row in picks.tolist()]
    rewards = reward(image_ids, captions, refs)                         # [B, k] float32, no gradient
    advantage = rewards - rewards.mean(dim=1, keepdim=True)             # mean-of-k baseline
    loss = -(advantage * policy.log_prob(picks.T).T).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0 or step == 29:
        print(f"step {step:2d}: mean reward {rewards.mean():.4f}")

highest = reward(image_ids, [pool] * len(image_ids), refs).max(dim=1).values  # every pool caption scored
print(f"highest mean reward the pool allows: {highest.mean():.4f}")
best = [pool[j] for j in logits.argmax(dim=1).tolist()]
result = score([images[i] for i in image_ids], best, refs, metric="ref-pac-s++", backbone=backbone)
for image_id, caption, value in zip(image_ids, best, result.scores):
    print(f"{image_id}: {caption!r} RefPAC-S++ {value:.4f}")
print(f"mean RefPAC-S++ {result.mean:.4f}")
